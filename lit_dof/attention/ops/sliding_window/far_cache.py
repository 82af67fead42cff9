"""The exact far cache (issue #45, item 3; design: docs/results/far_term/README.md): which far tokens a sliding-window
+ linear attention keeps exactly besides its window and sinks — per KV head, the ``K`` far tokens of highest score
among those that have left the window — and the score that ranks them, the attention mass the window's queries
gave a token while it was inside the window (the "heavy hitters" of H2O, Zhang et al. 2023, §3).
:func:`window_mass_scores` and :func:`cached_far_pairs` are quadratic references (:func:`running_top_k` gives the
latter's pairs as indices in ``O(T·(K + chunk))``); :func:`cached_far_pairs` feeds
:func:`~lit_dof.attention.ops.sliding_window.naive.naive_sliding_window_attention`, whose far sum then covers only
the uncached far tokens.

The score of token j is final at query j + w, when j leaves the window (rows j … j + w − 1 are done), so decoding
can keep the cache as a K-slot min-heap: the set at query i + 1 is the top K of the set at i and the one token that
left the window, i.e. at most one token enters and one leaves per step.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class FarCache:
    """The exact far cache of a decoding sequence (part of
    :class:`~lit_dof.attention.ops.sliding_window.chunked.SlidingWindowState`): K slots per key head and the running
    scores of the tokens still in the window.

    Attributes:
        keys: ``(B, Hk, K, d)``. values: ``(B, Hk, K, D)``. log_phi: ``(B, Hk, K, M)`` their far log-features.
        scores: ``(B, Hk, K)`` float64 (−inf: an empty slot). positions: ``(B, Hk, K)`` int64 (−1: empty).
        window_mass: ``(B, Hk, b)`` float64, the mass each window token has received so far (aligned with the
            state's window buffer).
    """

    keys: Tensor
    values: Tensor
    log_phi: Tensor
    scores: Tensor
    positions: Tensor
    window_mass: Tensor

    def tensors(self) -> list[Tensor]:
        """Every tensor held."""
        return [self.keys, self.values, self.log_phi, self.scores, self.positions, self.window_mass]

    def map(self, fn) -> FarCache:
        """The cache with ``fn`` applied to every tensor (batch selection, repetition)."""
        return FarCache(*(fn(t) for t in self.tensors()))


def cache_after(k: Tensor, v: Tensor, log_phi_k: Tensor, scores: Tensor, last: Tensor, keep: int) -> FarCache:
    """The cache after a fresh sequence: the last query's kept keys and the running scores of the last ``keep``.

    Args:
        k: ``(B, Hk, T, d)`` keys.
        v: ``(B, Hk, T, D)`` values.
        log_phi_k: ``(B, Hk, T, M)`` their far log-features.
        scores: ``(B, Hk, T)`` the window-mass scores.
        last: ``(B, Hk, K)`` the last query's kept positions (:func:`running_top_k`; −1: empty).
        keep: the window buffer's length.

    Returns:
        The cache.
    """
    empty, idx = last < 0, last.clamp_min(0)

    def pick(x: Tensor) -> Tensor:
        return x.gather(2, idx[..., None].expand(-1, -1, -1, x.shape[-1]))

    picked = scores.double().gather(-1, idx).masked_fill(empty, float("-inf"))
    return FarCache(pick(k), pick(v), pick(log_phi_k), picked, last, scores.double()[:, :, scores.shape[-1] - keep :])


def admit(cache: FarCache, key: Tensor, value: Tensor, log_phi: Tensor, score: Tensor, position: int, ok: Tensor):
    """The cache after one token left the window: it takes the slot of the lowest score (an empty one first, then
    the earliest among equal scores) when its score is at least that — ties go to the later key, as in
    :func:`running_top_k`.

    Args:
        cache: the cache.
        key: ``(B, Hk, d)`` the token's key.
        value: ``(B, Hk, D)`` its value.
        log_phi: ``(B, Hk, M)`` its far log-features.
        score: ``(B, Hk)`` its final window mass.
        position: its position.
        ok: ``(B,)`` bool, False for a padding token (never cached).

    Returns:
        The new cache (window_mass unchanged).
    """
    low = cache.scores.amin(-1, keepdim=True)
    among = cache.scores == low
    victim = torch.where(among, cache.positions, torch.iinfo(torch.long).max).argmin(-1, keepdim=True)  # (B, Hk, 1)
    enter = (score[..., None] >= low) & ok[:, None, None]  # (B, Hk, 1): the newcomer is later than every slot
    slot = torch.zeros_like(cache.scores, dtype=torch.bool).scatter_(-1, victim, True) & enter  # (B, Hk, K)

    def put(old: Tensor, new: Tensor) -> Tensor:
        return torch.where(slot[..., None] if old.dim() == 4 else slot, new.unsqueeze(2).to(old.dtype), old)

    positions = torch.where(slot, torch.full_like(cache.positions, position), cache.positions)
    scores = torch.where(slot, score[..., None].to(cache.scores.dtype), cache.scores)
    return FarCache(put(cache.keys, key), put(cache.values, value), put(cache.log_phi, log_phi), scores, positions,
                    cache.window_mass)  # fmt: skip


def apply_far_cache(
    y: Tensor,
    log_z: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_phi_q: Tensor,
    log_phi_k: Tensor,
    indices: Tensor,
    *,
    window: int,
    log_mix: Tensor | None = None,
    far_decay: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Turn sliding-window + additive-far-term attention into its exact-far-cache form: the cached far keys' kernel
    estimates leave the one normaliser and their exact terms ``exp(qᵀk/√d)`` enter it. Exact because the fixed-decay
    far sum does not depend on when a key entered it (docs/results/far_term/README.md): the sum over the uncached
    far keys is the sum over all far keys minus the cached ones'.

    Args:
        y: ``(B, Hq, T, D)`` the attention without the cache (window, sinks and every far key in one softmax).
        log_z: ``(B, Hq, T)`` the log of its normaliser.
        q: ``(B, Hq, T, d)`` queries (logits ``qᵀk/√d``).
        k: ``(B, Hk, T, d)`` keys.
        v: ``(B, Hk, T, D)`` values.
        log_phi_q: ``(B, Hq, T, M)`` the far term's exact query log-features.
        log_phi_k: ``(B, Hk, T, M)`` its key log-features.
        indices: ``(B, Hk, T, K)`` the cached far keys of each query (:func:`running_top_k`; −1: an empty slot).
        window: w, for the decay's distance beyond the window.
        log_mix: ``(Hq,)`` β, the far term's log-weight (``None``: 0).
        far_decay: ``(Hk,)`` λ, its decay per token beyond the window (``None``: 0).

    Returns:
        ``(y, log_z)`` with the cache, in y's dtype and log_z's.
    """
    K = indices.shape[-1]
    if K == 0:
        return y, log_z
    B, Hk, T = indices.shape[:3]
    idx = indices.clamp_min(0)

    def pick(x: Tensor) -> Tensor:  # (B, Hk, T, ·) → (B, Hk, T, K, ·), the cached keys' rows
        flat = x.gather(2, idx.flatten(2)[..., None].expand(-1, -1, -1, x.shape[-1]))
        return flat.view(B, Hk, T, K, x.shape[-1])

    return cached_terms(
        y, log_z, q, pick(k), pick(v), pick(log_phi_k), log_phi_q, indices, window=window, log_mix=log_mix,
        far_decay=far_decay, positions=torch.arange(T, device=q.device),
    )  # fmt: skip


def cached_terms(
    y: Tensor,
    log_z: Tensor,
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    log_phi_k: Tensor,
    log_phi_q: Tensor,
    cached: Tensor,
    *,
    window: int,
    positions: Tensor,
    log_mix: Tensor | None = None,
    far_decay: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`apply_far_cache` on gathered keys: each query's cached keys given as rows.

    Args:
        y: ``(B, Hq, T, D)`` the attention without the cache.
        log_z: ``(B, Hq, T)`` its log normaliser.
        q: ``(B, Hq, T, d)`` queries.
        keys: ``(B, Hk, T, K, d)`` each query's cached keys.
        values: ``(B, Hk, T, K, D)`` their values.
        log_phi_k: ``(B, Hk, T, K, M)`` their far log-features.
        log_phi_q: ``(B, Hq, T, M)`` the queries' far log-features.
        cached: ``(B, Hk, T, K)`` the cached keys' positions (−1: an empty slot).
        window: w.
        positions: ``(T,)`` the queries' positions.
        log_mix: ``(Hq,)`` β (``None``: 0).
        far_decay: ``(Hk,)`` λ (``None``: 0).

    Returns:
        ``(y, log_z)`` with the cache.
    """
    B, Hq, T, d = q.shape
    Hk = keys.shape[1]
    G, dtype = Hq // Hk, log_z.dtype
    valid = cached >= 0
    keys, values, log_phi = keys.to(dtype), values.to(dtype), log_phi_k.to(dtype)
    qg = q.to(dtype).view(B, Hk, G, T, d)
    exact = torch.einsum("bhgtd,bhtkd->bhgtk", qg, keys) / d**0.5
    lq = log_phi_q.to(dtype).view(B, Hk, G, T, 1, -1)
    estimate = torch.logsumexp(lq + log_phi[:, :, None], dim=-1)  # (B, Hk, G, T, K): log K̂(q_i, k_j)
    if log_mix is not None:
        estimate = estimate + log_mix.to(dtype).view(1, Hk, G, 1, 1)
    if far_decay is not None:
        beyond = positions.to(dtype)[:, None] - window - cached.to(dtype)  # (B, Hk, T, K)
        estimate = estimate - far_decay.to(dtype).view(1, Hk, 1, 1, 1) * beyond[:, :, None]
    mask = ~valid[:, :, None]
    exact, estimate = exact.masked_fill(mask, float("-inf")), estimate.masked_fill(mask, float("-inf"))
    lz = log_z.view(B, Hk, G, T)
    top = torch.maximum(lz, torch.maximum(exact.amax(-1), estimate.amax(-1)))
    w_old, w_in, w_out = (lz - top).exp(), (exact - top[..., None]).exp(), (estimate - top[..., None]).exp()
    delta = w_in - w_out  # (B, Hk, G, T, K): each cached key's exact weight minus its far estimate
    numerator = w_old[..., None] * y.to(dtype).view(B, Hk, G, T, -1) + torch.einsum("bhgtk,bhtkv->bhgtv", delta, values)
    denominator = w_old + delta.sum(-1)  # ≥ the window's own mass: the far estimates left were part of w_old
    out = (numerator / denominator[..., None]).reshape(B, Hq, T, -1).to(y.dtype)
    return out, (top + denominator.log()).reshape(B, Hq, T)
