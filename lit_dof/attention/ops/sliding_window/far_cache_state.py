"""The exact far cache in the attention (issue #45, item 3; which tokens it keeps:
:mod:`lit_dof.attention.ops.sliding_window.far_cache`): :func:`apply_far_cache` / :func:`cached_terms` turn an
attention without the cache into the one with it, and :class:`FarCache` with :func:`cache_after`, :func:`admit` and
:func:`decode_step` is the cache a decoding state carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class FarCache:
    """The exact far cache of a decoding sequence (part of
    :class:`~lit_dof.attention.ops.sliding_window.chunked.SlidingWindowState`): K slots per key head and the running
    scores of the tokens still in the window.

    Attributes:
        keys: ``(B, Hk, K, d)``. values: ``(B, Hk, K, D)``. log_phi: ``(B, Hk, K, M)`` their far log-features
            (M = 0 without a far term).
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


def cache_after(
    k: Tensor, v: Tensor, log_phi_k: Tensor | None, scores: Tensor, last: Tensor, keep: int, raw: Tensor | None = None
) -> FarCache:
    """The cache after a fresh sequence: the last query's kept keys and the running scores of the last ``keep``.

    Args:
        k: ``(B, Hk, T, d)`` keys.
        v: ``(B, Hk, T, D)`` values.
        log_phi_k: ``(B, Hk, T, M)`` their far log-features, or ``None`` (no far term: M = 0).
        scores: ``(B, Hk, T)`` the window-mass scores.
        last: ``(B, Hk, K)`` the last query's kept positions (:func:`running_top_k`; −1: empty).
        keep: the window buffer's length.
        raw: ``(B, Hk, T)`` the per-token scores a decoding state keeps when ``scores`` pools them (``None``: scores).

    Returns:
        The cache.
    """
    empty, idx = last < 0, last.clamp_min(0)
    picked = scores.double().gather(-1, idx).masked_fill(empty, float("-inf"))
    rows = (_rows(x, idx) for x in (k, v, k[..., :0] if log_phi_k is None else log_phi_k))
    window = (scores if raw is None else raw).double()
    return FarCache(*rows, picked, last, window[:, :, window.shape[-1] - keep :])


def _rows(x: Tensor, positions: Tensor) -> Tensor:
    """``x`` ``(B, Hk, T, F)`` at ``positions`` ``(B, Hk, *S)`` (valid indices into T): ``(B, Hk, *S, F)``."""
    B, Hk, F = x.shape[0], x.shape[1], x.shape[-1]
    flat = x.gather(2, positions.reshape(B, Hk, -1, 1).expand(-1, -1, -1, F))
    return flat.view(*positions.shape, F)


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
    return FarCache(
        put(cache.keys, key),
        put(cache.values, value),
        put(cache.log_phi, log_phi),
        scores,
        positions,
        cache.window_mass,
    )


def apply_far_cache(
    y: Tensor,
    log_z: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_phi_q: Tensor | None,
    log_phi_k: Tensor | None,
    indices: Tensor,
    *,
    window: int,
    log_mix: Tensor | None = None,
    far_decay: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Turn sliding-window + additive-far-term attention into its exact-far-cache form: the cached far keys' kernel
    estimates leave the one normaliser and their exact terms ``exp(qᵀk/√d)`` enter it. Exact because the fixed-decay
    far sum does not depend on when a key entered it (docs/results/far_term/README.md): the sum over the uncached
    far keys is the sum over all far keys minus the cached ones'. Without a far term (no log-features) the cached
    keys' exact terms join the window's softmax and nothing leaves it: window + sinks + heavy hitters (H2O's
    cache, Zhang et al. 2023, with StreamingLLM's sinks).

    Args:
        y: ``(B, Hq, T, D)`` the attention without the cache (window, sinks and every far key in one softmax).
        log_z: ``(B, Hq, T)`` the log of its normaliser.
        q: ``(B, Hq, T, d)`` queries (logits ``qᵀk/√d``).
        k: ``(B, Hk, T, d)`` keys.
        v: ``(B, Hk, T, D)`` values.
        log_phi_q: ``(B, Hq, T, M)`` the far term's exact query log-features, or ``None`` (no far term).
        log_phi_k: ``(B, Hk, T, M)`` its key log-features, or ``None`` together with ``log_phi_q``.
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
    idx = indices.clamp_min(0)

    return cached_terms(
        y,
        log_z,
        q,
        _rows(k, idx),
        _rows(v, idx),
        None if log_phi_k is None else _rows(log_phi_k, idx),
        log_phi_q,
        indices,
        window=window,
        log_mix=log_mix,
        far_decay=far_decay,
        positions=torch.arange(indices.shape[2], device=q.device),
    )


def cached_terms(
    y: Tensor,
    log_z: Tensor,
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    log_phi_k: Tensor | None,
    log_phi_q: Tensor | None,
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
        log_phi_k: ``(B, Hk, T, K, M)`` their far log-features, or ``None`` (no far term: no estimate leaves).
        log_phi_q: ``(B, Hq, T, M)`` the queries' far log-features, or ``None`` (with ``log_phi_k``).
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
    keys, values = keys.to(dtype), values.to(dtype)
    qg = q.to(dtype).view(B, Hk, G, T, d)
    exact = torch.einsum("bhgtd,bhtkd->bhgtk", qg, keys) / d**0.5
    if log_phi_q is None or log_phi_k is None:  # no far term: nothing of the cached keys was in the normaliser
        estimate = torch.full_like(exact, float("-inf"))
    else:
        lq = log_phi_q.to(dtype).view(B, Hk, G, T, 1, -1)
        estimate = torch.logsumexp(lq + log_phi_k.to(dtype)[:, :, None], dim=-1)  # (B, Hk, G, T, K): log K̂(q_i, k_j)
    if log_mix is not None and log_phi_q is not None:
        estimate = estimate + log_mix.to(dtype).view(1, Hk, G, 1, 1)
    if far_decay is not None and log_phi_q is not None:
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


def decode_step(
    prev,
    q: Tensor,
    keys: Tensor,
    valid: Tensor,
    log_z: Tensor,
    P: int,
    window: int,
    sinks: int,
    score: str,
    pool: int = 0,
):
    """The far cache after one decoding step at position P: the token leaving the window (position P − w, not a sink,
    not padding) admitted with its final score, then the window's scores updated — ``"window_mass"``: every window
    key's mass grown by this query's exact softmax row; ``"novelty"``: the new key's novelty among the keys before it
    in its window appended (:func:`~lit_dof.attention.ops.sliding_window.far_cache.key_novelty`).

    Args:
        prev: the :class:`~lit_dof.attention.ops.sliding_window.chunked.SlidingWindowState` before the step.
        q: ``(B, Hq, 1, d)`` the query.
        keys: ``(B, Hk, b + 1, d)`` the key stream, the query's own last.
        valid: ``(B, b + 1)`` bool, False for padding keys.
        log_z: ``(B, Hq, 1)`` the exact part's log normaliser.
        P: the query's position.
        window: w.
        sinks: s.
        score: ``"window_mass"`` or ``"novelty"``.
        pool: r: the leaving token ranks by the highest score of itself and the r tokens after it.

    Returns:
        The new :class:`FarCache`.
    """
    cache, b = prev.cache, prev.keys.shape[2]
    if b == window and P - window >= sinks:  # the buffer's oldest token leaves the window now
        cache = admit(
            cache,
            prev.keys[:, :, 0],
            prev.values[:, :, 0],
            prev.keys[:, :, 0, :0] if prev.log_phi_k is None else prev.log_phi_k[:, :, 0],
            cache.window_mass[:, :, : pool + 1].amax(-1),
            P - window,
            prev.valid[:, 0],
        )
    if score == "novelty":  # the new key against the w − 1 keys before it (padding excluded)
        unit = torch.nn.functional.normalize(keys[:, :, -window:].double(), dim=-1)
        cos = torch.einsum("bhd,bhld->bhl", unit[:, :, -1], unit[:, :, :-1])
        cos = cos.masked_fill(~valid[:, None, -window:-1], float("-inf"))
        best = torch.cat([cos, cos.new_full((*cos.shape[:-1], 1), -2.0)], -1).amax(-1, keepdim=True)  # −2: none before
        new = torch.where(best > -2, 1 - best, 1.0)
        mass = torch.cat([cache.window_mass, new.to(cache.window_mass.dtype)], 2)
        return FarCache(cache.keys, cache.values, cache.log_phi, cache.scores, cache.positions, mass[:, :, -window:])
    B, Hq, _, d = q.shape
    Hk = keys.shape[1]
    inside = keys[:, :, -window:].to(log_z.dtype)  # (B, Hk, L, d): the window of query P, its own key last
    logits = torch.einsum("bhgd,bhld->bhgl", q.to(log_z.dtype).view(B, Hk, Hq // Hk, d), inside) / d**0.5
    weights = (logits - log_z.view(B, Hk, Hq // Hk, 1)).exp() * valid[:, None, None, -window:]
    mass = torch.cat([cache.window_mass, cache.window_mass.new_zeros(B, Hk, 1)], 2)
    mass[:, :, -inside.shape[2] :] += weights.sum(2).to(mass.dtype)
    return FarCache(cache.keys, cache.values, cache.log_phi, cache.scores, cache.positions, mass[:, :, -window:])
