"""The exact far cache (issue #45, item 3; design: docs/results/far_term/README.md): which far tokens a sliding-window
+ linear attention keeps exactly besides its window and sinks — per KV head, the ``K`` far tokens of highest score
among those that have left the window — and the score that ranks them, the attention mass the window's queries
gave a token while it was inside the window (the "heavy hitters" of H2O, Zhang et al. 2023, §3), or its novelty
among the keys before it in its window (:func:`key_novelty`: a score that does not depend on who attends it).
:func:`window_mass_scores` and :func:`cached_far_pairs` are quadratic references (:func:`running_top_k` gives the
latter's pairs as indices in ``O(T·(K + chunk))``); :func:`cached_far_pairs` feeds
:func:`~lit_dof.attention.ops.sliding_window.naive.naive_sliding_window_attention`, whose far sum then covers only
the uncached far tokens. How the kept tokens enter the attention and a decoding state:
:mod:`lit_dof.attention.ops.sliding_window.far_cache_state`.

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


def banded_window_mass(q: Tensor, k: Tensor, log_z: Tensor, *, window: int, chunk_size: int = 64) -> Tensor:
    """:func:`window_mass_scores` in ``O(T·(chunk + w))`` memory, from the exact part's normaliser: the window rows'
    weights ``exp(qᵀk/√d − log_z_i)`` over the band of keys each query chunk has in its window, summed per key.

    Args:
        q: ``(B, Hq, T, d)`` queries (logits ``qᵀk/√d``).
        k: ``(B, Hk, T, d)`` keys.
        log_z: ``(B, Hq, T)`` the log normaliser of the exact part alone (window and sinks: the softmax the scores
            are mass of).
        window: w ≥ 1.
        chunk_size: queries per step.

    Returns:
        ``(B, Hk, T)`` scores in log_z's dtype.

    Raises:
        ValueError: ``window`` or ``chunk_size`` < 1.
    """
    if window < 1 or chunk_size < 1:
        raise ValueError(f"window {window} and chunk_size {chunk_size} must be ≥ 1")
    B, Hq, T, d = q.shape
    Hk = k.shape[1]
    G, dtype = Hq // Hk, log_z.dtype
    qg, kk, lz = q.to(dtype).view(B, Hk, G, T, d), k.to(dtype), log_z.view(B, Hk, G, T)
    scores = torch.zeros(B, Hk, T, dtype=dtype, device=q.device)
    for start in range(0, T, chunk_size):
        stop = min(T, start + chunk_size)
        lo = max(0, start - window + 1)  # the band: every key some query of the chunk has in its window
        logits = torch.einsum("bhgtd,bhsd->bhgts", qg[:, :, :, start:stop], kk[:, :, lo:stop]) / d**0.5
        i = torch.arange(start, stop, device=q.device)[:, None]
        j = torch.arange(lo, stop, device=q.device)[None, :]
        inside = (j <= i) & (j > i - window)
        weights = (logits - lz[:, :, :, start:stop, None]).exp().masked_fill(~inside, 0.0)
        scores[:, :, lo:stop] += weights.sum(dim=(2, 3))
    return scores


CACHE_SCORES = ("window_mass", "novelty")
"""What ranks the far tokens a cache keeps: :func:`window_mass_scores` (H2O's heavy hitters) or :func:`key_novelty`."""


def key_novelty(k: Tensor, *, window: int, valid: Tensor | None = None, chunk_size: int = 64) -> Tensor:
    """Each key's novelty among the keys before it in its own window: ``1 − max cos(k_j, k_i)`` over
    ``j − w < i < j`` (1 for a key with none), known when the key arrives and whoever attends it later — high for a
    key unlike its neighbours (a random number in repetitive text), low for one the window already holds.

    Args:
        k: ``(B, Hk, T, d)`` keys.
        window: w ≥ 1 (w = 1: every key scores 1).
        valid: ``(B, T)`` bool, False for padding keys (never a neighbour), or ``None``.
        chunk_size: keys per step (memory ``O(T·(chunk + w))``).

    Returns:
        ``(B, Hk, T)`` float64 scores in [0, 2].

    Raises:
        ValueError: ``window`` or ``chunk_size`` < 1.
    """
    if window < 1 or chunk_size < 1:
        raise ValueError(f"window {window} and chunk_size {chunk_size} must be ≥ 1")
    B, Hk, T, _ = k.shape
    unit = torch.nn.functional.normalize(k.double(), dim=-1)
    ok = torch.ones(B, T, dtype=torch.bool, device=k.device) if valid is None else valid.bool()
    out = torch.ones(B, Hk, T, dtype=torch.float64, device=k.device)
    for start in range(0, T, chunk_size):
        stop = min(T, start + chunk_size)
        lo = max(0, start - window + 1)  # every key some key of the chunk has before it in its window
        cos = torch.einsum("bhtd,bhsd->bhts", unit[:, :, start:stop], unit[:, :, lo:stop])
        i = torch.arange(start, stop, device=k.device)[:, None]
        j = torch.arange(lo, stop, device=k.device)[None, :]
        before = ((j < i) & (j > i - window))[None, None] & ok[:, None, None, lo:stop]
        best = cos.masked_fill(~before, float("-inf")).amax(-1)
        out[:, :, start:stop] = torch.where(best > float("-inf"), 1.0 - best, 1.0)
    return out


def check_cache_score(score: str, pool: int, window: int) -> None:
    """Refuse an unknown cache score, or a pool outside [0, w) or with the window-mass score (ValueError)."""
    if score not in CACHE_SCORES or not 0 <= pool < window or (pool and score != "novelty"):
        raise ValueError(
            f"far_cache_score {score!r} must be one of {CACHE_SCORES}; far_cache_pool {pool} in [0, w = {window}), "
            "with the novelty score only"
        )


def cache_scores(
    score: str, q: Tensor, k: Tensor, log_z: Tensor, valid: Tensor, *, window: int, pool: int = 0, chunk_size: int = 64
) -> tuple[Tensor, Tensor]:
    """The scores a fresh sequence's cache ranks its far tokens by, and the per-token scores a decoding state keeps.

    Args:
        score: ``"window_mass"`` (:func:`banded_window_mass`) or ``"novelty"`` (:func:`key_novelty`).
        q: ``(B, Hq, T, d)`` queries.
        k: ``(B, Hk, T, d)`` keys.
        log_z: ``(B, Hq, T)`` the exact part's log normaliser.
        valid: ``(B, T)`` bool, False for padding (never cached).
        window: w.
        pool: r ≥ 0 (novelty only, r < w): a token ranks by the highest novelty of itself and the r tokens after
            it — known before it leaves the window — so a run of similar tokens just before a novel one (the digits
            of a number before "Remember") is kept with it.
        chunk_size: tokens per step.

    Returns:
        ``(ranked, raw)``, each ``(B, Hk, T)``: the ranking scores (−inf for padding) and the unpooled ones.

    Raises:
        ValueError: an unknown score, or ``pool`` outside [0, w) or with the window-mass score.
    """
    check_cache_score(score, pool, window)
    if score == "novelty":
        raw = key_novelty(k, window=window, valid=valid, chunk_size=chunk_size)
    else:
        raw = banded_window_mass(q, k, log_z, window=window, chunk_size=chunk_size)
    raw = raw.masked_fill(~valid[:, None, :], float("-inf"))  # padding is never cached
    if not pool:
        return raw, raw
    padded = torch.nn.functional.pad(raw, (0, pool), value=float("-inf"))
    ranked = padded.unfold(-1, pool + 1, 1).amax(-1)  # max over tokens j … j + r
    return ranked.masked_fill(~valid[:, None, :], float("-inf")), raw


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


def running_top_k(scores: Tensor, *, window: int, sink_tokens: int = 0, size: int, chunk_size: int = 64) -> Tensor:
    """:func:`cached_far_pairs` as indices, in ``O(T·(K + chunk))`` memory: for each query chunk the candidates are
    the top K of the far keys before the chunk and the keys that leave the window during it (the top K of a prefix
    lies in the top K of a shorter prefix and the keys added since).

    Args:
        scores: ``(B, Hk, T)`` each key's score.
        window: w ≥ 1.
        sink_tokens: s ≥ 0.
        size: K ≥ 0.
        chunk_size: queries per step.

    Returns:
        ``(B, Hk, T, K)`` int64 key positions, highest score first (ties: the later key first), −1 where a query has
        fewer than K far keys.

    Raises:
        ValueError: ``size < 0`` or ``chunk_size < 1``.
    """
    if size < 0 or chunk_size < 1:
        raise ValueError(f"the far cache holds K ≥ 0 tokens (got {size}), in query chunks ≥ 1 (got {chunk_size})")
    B, Hk, T = scores.shape
    out = torch.full((B, Hk, T, size), -1, dtype=torch.long, device=scores.device)
    if size == 0:
        return out
    score = scores.double()
    kept = torch.empty(B, Hk, 0, dtype=torch.long, device=scores.device)  # the top K of the far keys so far
    for start in range(0, T, chunk_size):
        stop = min(T, start + chunk_size)
        lo, hi = max(sink_tokens, start - window), stop - window  # the keys that turn far during the chunk
        new = torch.arange(lo, max(lo, hi), device=scores.device).expand(B, Hk, -1)
        candidates = torch.cat([kept, new], -1)  # (B, Hk, C) positions
        if candidates.shape[-1] == 0:
            continue
        value = score.gather(-1, candidates)  # (B, Hk, C)
        i = torch.arange(start, stop, device=scores.device)[:, None]  # (n, 1) queries
        far = (candidates[:, :, None, :] <= i - window) & (candidates[:, :, None, :] >= sink_tokens)  # (B, Hk, n, C)
        # rank by score, then by position (the later key first among ties): a stable sort on the reversed order
        by_position = candidates.argsort(-1, descending=True)
        ranked_pos = candidates.gather(-1, by_position)
        ranked_far = far.gather(-1, by_position[:, :, None, :].expand_as(far))
        ranked_val = value.gather(-1, by_position)[:, :, None, :].masked_fill(~ranked_far, float("-inf"))
        order = ranked_val.sort(dim=-1, descending=True, stable=True).indices[..., :size]  # (B, Hk, n, ≤K)
        top_pos = ranked_pos[:, :, None, :].expand_as(ranked_val).gather(-1, order)
        top_ok = ranked_val.gather(-1, order) > float("-inf")
        width = order.shape[-1]
        out[:, :, start:stop, :width] = torch.where(top_ok, top_pos, torch.full_like(top_pos, -1))
        last = out[:, :, stop - 1]  # the chunk's last query holds the top K of every far key so far
        kept = last[..., (last >= 0).all(dim=(0, 1))] if B * Hk else last
    return out
