"""The exact far cache (issue #45, item 3; design: docs/results/far_term/README.md): which far tokens a sliding-window
+ linear attention keeps exactly besides its window and sinks — per KV head, the ``K`` far tokens of highest score
among those that have left the window — and the score that ranks them, the attention mass the window's queries
gave a token while it was inside the window (the "heavy hitters" of H2O, Zhang et al. 2023, §3). Both are
quadratic float64-friendly references: :func:`cached_far_pairs` feeds
:func:`~lit_dof.attention.ops.sliding_window.naive.naive_sliding_window_attention`, whose far sum then covers only
the uncached far tokens.

The score of token j is final at query j + w, when j leaves the window (rows j … j + w − 1 are done), so decoding
can keep the cache as a K-slot min-heap: the set at query i + 1 is the top K of the set at i and the one token that
left the window, i.e. at most one token enters and one leaves per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_dof.attention.ops.sliding_window.naive import sliding_window_masks


def window_mass_scores(q: Tensor, k: Tensor, *, window: int, sink_tokens: int = 0) -> Tensor:
    """Each key's attention mass from the queries that had it in their exact window: Σ_{i=j}^{j+w−1} a_ij, a the
    softmax over the exact pairs only (window and sinks; :func:`sliding_window_masks`), summed over the query heads
    that share the key head (GQA).

    Args:
        q: ``(B, Hq, T, d)`` queries (scaled by the caller as for the attention itself: logits ``qᵀk/√d``).
        k: ``(B, Hk, T, d)`` keys; ``Hq`` a multiple of ``Hk``.
        window: w ≥ 1, tokens attended exactly (the query's own included).
        sink_tokens: s ≥ 0, the first tokens always attended exactly (their own window mass is counted too; they
            are never far).

    Returns:
        ``(B, Hk, T)`` float64 scores ≥ 0 (the last w − 1 keys' are partial: they have not left the window).

    Raises:
        ValueError: ``window < 1``, ``sink_tokens < 0`` or ``Hq`` not a multiple of ``Hk``.
    """
    B, Hq, T, d = q.shape
    Hk = k.shape[1]
    if window < 1 or sink_tokens < 0 or Hq % Hk:
        raise ValueError(f"window {window} ≥ 1, sink_tokens {sink_tokens} ≥ 0 and Hq {Hq} a multiple of Hk {Hk}")
    exact, _ = sliding_window_masks(T, window, sink_tokens, device=q.device)
    logits = q.double() @ k.double().repeat_interleave(Hq // Hk, dim=1).transpose(-1, -2) / d**0.5
    weights = torch.softmax(logits.masked_fill(~exact, float("-inf")), dim=-1)
    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(T, device=q.device)[None, :]
    inside = (j <= i) & (i < j + window)  # key j in query i's window (not as a sink)
    mass = (weights * inside).sum(-2)  # (B, Hq, T): over the queries
    return mass.view(B, Hk, Hq // Hk, T).sum(2)


def cached_far_pairs(scores: Tensor, *, window: int, sink_tokens: int = 0, size: int) -> Tensor:
    """The far pairs kept exactly: for query i, the ``size`` far keys (``s ≤ j ≤ i − w``) of highest score, ties to
    the later key.

    Args:
        scores: ``(B, Hk, T)`` each key's score (e.g. :func:`window_mass_scores`).
        window: w ≥ 1.
        sink_tokens: s ≥ 0.
        size: K ≥ 0, far tokens kept per key head.

    Returns:
        ``(B, Hk, T, T)`` bool over (query i, key j): True where j is far for i and among i's K kept; every row has
        ``min(K, number of far keys)`` of them.

    Raises:
        ValueError: ``size < 0``.
    """
    if size < 0:
        raise ValueError(f"the far cache holds K ≥ 0 tokens, got {size}")
    B, Hk, T = scores.shape
    _, far = sliding_window_masks(T, window, sink_tokens, device=scores.device)
    if size == 0 or T == 0:
        return torch.zeros(B, Hk, T, T, dtype=torch.bool, device=scores.device)
    ranked = scores.double()[:, :, None, :].masked_fill(~far, float("-inf"))  # (B, Hk, T, T)
    # highest score first, the later key first among ties: a stable descending sort of the keys in reverse order
    order = ranked.flip(-1).sort(dim=-1, descending=True, stable=True).indices[..., : min(size, T)]
    top = T - 1 - order
    kept = torch.zeros(B, Hk, T, T, dtype=torch.bool, device=scores.device).scatter_(-1, top, True)
    return kept & far
