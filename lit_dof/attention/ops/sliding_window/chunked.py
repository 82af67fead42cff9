"""Sliding-window + linear attention: exact softmax over the recent tokens, linear attention for the rest.

Notation: B batch, Hq query heads, Hk key/value heads (G = Hq / Hk), T new tokens, d head size, D value
size, M features, w window (tokens), s attention-sink tokens. Positions are absolute (0 = first token).

For a query at position p and a key at position t ≤ p::

    exact   E_p = {t : p − w < t ≤ p} ∪ {t : t < s}   softmax terms  e^{a_pt},  a_pt = q_pᵀk_t/√d
    linear  L_p = {t : s ≤ t ≤ p − w}                    kernel terms   κ_pt = e^{β_h + Σ_{t+w<i≤p} g_hi} K̂(q_p, k_t)
    y_p = (Σ_E e^{a_pt} v_t + Σ_L κ_pt v_t) / (Σ_E e^{a_pt} + Σ_L κ_pt)

Every term estimates exp(qᵀk/√d), so numerators and denominators simply add (one normaliser); β_h is an
optional per-query-head log-weight of the linear terms that training can use to turn a useless far term
down (the mixing factor of LoLCATs, Zhang et al. 2025, §3.1). g_hi ≤ 0 is an optional log forget gate of the far
memory: each token i, as it arrives, keeps e^{g_hi} of every far key's weight, so a far key counts with the gates
of the tokens that arrived after it left the window. A constant ``g = −λ_h`` (``far_decay``) is the scalar decay of
RetNet (Sun et al. 2023, §2.1) applied to the far part only: the far term sees ≈ 1/λ_h tokens past the window
whatever the context length, so a term trained on short blocks meets the distances it was trained on at any
length; a data-dependent ``g`` per head and token (``far_log_gates``) is the scalar forget gate of Mamba-2 (Dao &
Gu 2024, §3) and simple GLA (Yang et al. 2024); both add. ``s`` tokens kept exact are StreamingLLM's attention
sinks (Xiao et al. 2024, §3). ``w = 1, s = 0`` leaves only the token itself exact.

Each part is computed normalised with its log-normaliser — the window by a banded, chunked softmax, the far
part by :func:`~lit_dof.attention.ops.linear.aligned.aligned_linear_attention` on the key stream delayed by w
tokens, queries and far keys aligned one to one (a query with the key w positions before it), where the gates are
offsets of the log-features — and the parts are merged by their normalisers (:func:`merge_normalized`), so nothing
overflows for any norm. Decoding keeps a :class:`SlidingWindowState`: the last ≤ w keys/values, the s sink
keys/values and the linear state of everything older, so its memory is constant in the context length.

Sinks are the first s *positions* of the sequence: in a left-padded batch a padded row's sinks are padding
(masked), and its first real tokens are attended like any other — such a row can differ from the same text
run alone when s > 0 (right padding, or none, is unaffected).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_dof.attention._validation import check_grouped_qkv, check_positive_int, check_sink_tokens
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE, LinearAttentionState
from lit_dof.attention.ops.sliding_window.far_cache import cache_scores, check_cache_score, running_top_k
from lit_dof.attention.ops.sliding_window.far_cache_state import (
    FarCache,
    apply_far_cache,
    cache_after,
    cached_terms,
    decode_step,
)
from lit_dof.attention.ops.sliding_window.far_part import FarPart
from lit_dof.attention.ops.sliding_window.flex import flex_window_softmax
from lit_dof.attention.ops.sliding_window.softmax import band_and_sinks_softmax, decode_window_softmax, merge_normalized
from lit_dof.precision import fp32_region


@dataclass
class SlidingWindowState:
    """What decoding keeps for sliding-window + linear attention (constant in the context length).

    Attributes:
        linear: the linear state of every non-sink key that has left the window, or ``None`` before the first.
        keys: ``(B, Hk, b, d)`` the last b ≤ w keys (post-RoPE). values: ``(B, Hk, b, D)``.
        log_phi_k: ``(B, Hk, b, M)`` their key log-features, or ``None``: without a linear term, and between calls
            of a layer that recomputes them from ``keys`` (and ``rotary``) when they leave the window
            (:class:`~lit_dof.attention.layers.sliding_window.SlidingWindowLinearAttention`).
        valid: ``(B, b)`` bool, False for padding keys.
        sink_keys: ``(B, Hk, s', d)`` the first s' = min(s, seen) keys. sink_values: ``(B, Hk, s', D)``.
        sink_valid: ``(B, s')`` bool.
        seen: tokens seen so far (the absolute position of the next token).
        write: ``(B, Hk, b)`` the window keys' write strengths, with a delta-rule far memory; else ``None``.
        memory: ``(B, Hk, M, D)`` the delta-rule far memory (``linear`` then holds only its normaliser), or
            ``None``.
        cache: the exact far cache (:class:`~lit_dof.attention.ops.sliding_window.far_cache_state.FarCache`), or
            ``None``.
        rotary: ``(B, b, r/2 + 1)`` the window keys' rotation angles and scale
            (:func:`~lit_dof.attention.ops.rotary.rotation_angles`), kept by a layer whose far term sees un-rotated
            keys; else ``None``.
    """

    linear: LinearAttentionState | None
    keys: Tensor
    values: Tensor
    log_phi_k: Tensor | None
    valid: Tensor
    sink_keys: Tensor
    sink_values: Tensor
    sink_valid: Tensor
    seen: int
    write: Tensor | None = None
    memory: Tensor | None = None
    cache: FarCache | None = None
    rotary: Tensor | None = None

    def _tensors(self) -> list[Tensor]:
        tensors = [self.keys, self.values, self.valid, self.sink_keys, self.sink_values, self.sink_valid]
        cache = self.cache.tensors() if self.cache is not None else []
        optional = (self.log_phi_k, self.write, self.memory, self.rotary)
        return tensors + [t for t in optional if t is not None] + cache

    @property
    def nbytes(self) -> int:
        """Bytes held (window buffer, sinks and linear state); bounded by the window, not the context."""
        linear = self.linear.nbytes if self.linear is not None else 0
        return linear + sum(t.numel() * t.element_size() for t in self._tensors())

    def _map(self, fn) -> "SlidingWindowState":
        linear = (
            None
            if self.linear is None
            else LinearAttentionState(*(fn(t) for t in (self.linear.kv, self.linear.k_sum, self.linear.log_scale)))
        )
        return SlidingWindowState(
            linear,
            fn(self.keys),
            fn(self.values),
            None if self.log_phi_k is None else fn(self.log_phi_k),
            fn(self.valid),
            fn(self.sink_keys),
            fn(self.sink_values),
            fn(self.sink_valid),
            self.seen,
            None if self.write is None else fn(self.write),
            None if self.memory is None else fn(self.memory),
            None if self.cache is None else self.cache.map(fn),
            None if self.rotary is None else fn(self.rotary),
        )

    def index_select(self, dim: int, index: Tensor) -> "SlidingWindowState":
        """Select batch rows (``dim=0``), e.g. for beam-search reordering."""
        return self._map(lambda t: t.index_select(dim, index))

    def repeat_interleave(self, repeats: int) -> "SlidingWindowState":
        """Repeat every batch row ``repeats`` times (e.g. ``num_return_sequences`` in generation)."""
        return self._map(lambda t: t.repeat_interleave(repeats, dim=0))


def _empty_state_like(k: Tensor, v: Tensor, log_phi_k: Tensor | None) -> SlidingWindowState:
    B, Hk = k.shape[:2]
    none = k.new_zeros(B, Hk, 0, k.shape[-1]), v.new_zeros(B, Hk, 0, v.shape[-1])
    flags = torch.ones(B, 0, dtype=torch.bool, device=k.device)
    log_phi = None if log_phi_k is None else log_phi_k.new_zeros(B, Hk, 0, log_phi_k.shape[-1])
    return SlidingWindowState(None, *none, log_phi, flags, *none, flags.clone(), 0)


@fp32_region()
def sliding_window_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_phi_q: Tensor | None,
    log_phi_k: Tensor | None,
    *,
    window: int,
    sink_tokens: int = 0,
    log_mix: Tensor | None = None,
    far_decay: Tensor | None = None,
    far_log_gates: Tensor | None = None,
    far_write: Tensor | None = None,
    state: SlidingWindowState | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    window_kernel: str = "torch",
    linear_kernel: str = "torch",
    far_cache: int = 0,
    far_cache_score: str = "window_mass",
    far_cache_pool: int = 0,
) -> tuple[Tensor, SlidingWindowState]:
    """Causal sliding-window softmax + linear attention over T new tokens (training, prefill and decoding).

    Args:
        q: ``(B, Hq, T, d)`` queries (post-RoPE), scaled so that the softmax logits are qᵀk/√d.
        k: ``(B, Hk, T, d)`` keys; ``Hq % Hk == 0`` (GQA, keys never repeated).
        v: ``(B, Hk, T, D)`` values.
        log_phi_q: ``(B, Hq, T, M)`` query log-features, exact (no dropped per-row constant: the linear terms
            are added to exact softmax terms), or ``None`` for no linear term (the window and sinks alone).
        log_phi_k: ``(B, Hk, T, M)`` key log-features, or ``None`` together with ``log_phi_q``.
        window: w ≥ 1, the tokens attended exactly (the query's own token included).
        sink_tokens: s ≥ 0, the first tokens of the sequence always attended exactly.
        log_mix: ``(Hq,)`` β, log-weight of the linear terms per query head (``None``: 0).
        far_decay: ``(Hk,)`` λ ≥ 0, decay rate of the linear terms per key head in nats per token of distance
            beyond the window (``None``: 0, no decay): the constant gate ``g = −λ``; or ``(Hk, M)``, one rate per
            feature (GLA's per-channel decay, Yang et al. 2024, §4, without its data dependence: feature f of a far
            key weighs e^{−λ_f (i − w − j)}; the additive far term without gates or a far cache). A call's state
            carries it: pass the same λ to every call.
        far_log_gates: ``(B, Hk, T)`` g ≤ 0, the log forget gate of the far memory at each new token in nats
            (added to ``−far_decay``), or ``None``.
        far_write: ``(B, Hk, T)`` β ∈ [0, 1], the write strength of each new token's key: the far values then
            come from a delta-rule memory over the unit features, weighted by the additive normaliser
            (:mod:`lit_dof.attention.ops.delta_rule.far`); ``None``: the additive far term. Pass it to every
            call of a sequence or to none.
        state: state after the preceding tokens (decoding, chunked prefill), or ``None`` for a fresh sequence.
        key_padding_mask: ``(B, T)`` bool, False for padding keys (never attended; rows of padding queries are
            finite but meaningless).
        chunk_size: query chunk of the window part (its temporaries are ``O(T·(chunk + w))``) and chunk
            size of the linear kernel.
        window_kernel: the window + sinks softmax of a fresh sequence (no ``state``, T > 1): ``"torch"``, the
            banded chunked softmax, or ``"flex"``, PyTorch's ``flex_attention`` with a block mask
            (:mod:`lit_dof.attention.ops.sliding_window.flex`; compiled on CUDA; its backward needs CUDA).
            Continuations and decoding use the former.
        linear_kernel: the far term over more than one token: ``"torch"``, the chunked kernels, or ``"fla"``,
            flash-linear-attention's simple-GLA kernel (:mod:`lit_dof.attention.ops.linear.fla`) and, for the
            delta-rule memory, its gated delta-rule kernel (:mod:`lit_dof.attention.ops.delta_rule.fla`); decoding
            steps use the PyTorch forms either way (the states are the same).
        far_cache: K ≥ 0, far tokens per key head kept exactly (:mod:`lit_dof.attention.ops.sliding_window.far_cache`:
            the K of highest window attention mass among those that left the window, in the one softmax; the far
            sum covers the rest, or nothing without log-features: window + sinks + heavy hitters). With the
            additive, fixed-decay far term or none (no ``far_log_gates`` or ``far_write``); a fresh sequence, then
            one token at a time from its state.
        far_cache_score: what ranks the far tokens (``far_cache.CACHE_SCORES``): ``"window_mass"``, the attention
            mass the window gave them, or ``"novelty"``, how unlike the keys before it in its window a key is.
        far_cache_pool: r, a novelty ranks the r tokens before it too (``far_cache.cache_scores``).

    Returns:
        ``(y, state)``: ``y`` ``(B, Hq, T, D)`` in v's dtype, computed in float32 (float64 for float64
        inputs) with autocast off, whatever the surrounding precision (:func:`lit_dof.precision.fp32_region`);
        the :class:`SlidingWindowState` after the last token.

    Raises:
        ValueError: inconsistent shapes, ``window < 1``, ``sink_tokens < 0``, only one of the log-features,
            ``far_decay`` not of shape ``(Hk,)`` or ``(Hk, M)`` (the latter with gates, ``far_write`` or a far
            cache), ``far_log_gates`` or ``far_write`` not of shape ``(B, Hk, T)``, an
            unknown ``window_kernel`` or ``linear_kernel``, ``far_cache`` where it does not apply, or an unknown
            ``far_cache_score`` or a ``far_cache_pool`` outside [0, w) or not with the novelty score.
    """
    B, Hq, Hk, T, d = check_grouped_qkv(q, k, v)
    check_positive_int("window", window)
    check_positive_int("chunk_size", chunk_size)
    check_sink_tokens(sink_tokens)
    if (log_phi_q is None) != (log_phi_k is None):
        raise ValueError("pass both log_phi_q and log_phi_k (linear far term) or neither (window and sinks only)")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, T):
        raise ValueError(f"key_padding_mask must have shape (B, T) = {(B, T)}, got {tuple(key_padding_mask.shape)}")
    if window_kernel not in ("torch", "flex"):
        raise ValueError(f"window_kernel must be 'torch' or 'flex', got {window_kernel!r}")
    if linear_kernel not in ("torch", "fla"):
        raise ValueError(f"linear_kernel must be 'torch' or 'fla', got {linear_kernel!r}")
    M = None if log_phi_k is None else log_phi_k.shape[-1]
    if far_decay is not None and tuple(far_decay.shape) not in ((Hk,), (Hk, M)):
        raise ValueError(f"far_decay must have shape (Hk,) or (Hk, M) = ({Hk}, {M}), got {tuple(far_decay.shape)}")
    if (
        far_decay is not None
        and far_decay.dim() == 2
        and (far_cache or far_log_gates is not None or far_write is not None)
    ):
        raise ValueError(
            "a decay per feature (far_decay (Hk, M)) goes with the additive far term alone: no gates, "
            "no far_write, no far_cache"
        )
    for name, x in (("far_log_gates", far_log_gates), ("far_write", far_write)):
        if x is not None and tuple(x.shape) != (B, Hk, T):
            raise ValueError(f"{name} must have shape (B, Hk, T) = {(B, Hk, T)}, got {tuple(x.shape)}")
    check_cache_score(far_cache_score, far_cache_pool, window)
    if far_cache and (far_log_gates is not None or far_write is not None):
        raise ValueError("far_cache needs the additive fixed-decay far term or none (no gates, no far_write)")
    if far_cache and state is not None and state.seen and (T != 1 or state.cache is None):
        raise ValueError("with far_cache a sequence continues one token at a time from a state that has its cache")
    G = Hq // Hk
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    prev = state if state is not None else _empty_state_like(k, v, log_phi_k)
    if prev.keys.shape[2] > window:
        raise ValueError(f"state holds {prev.keys.shape[2]} window keys, more than window={window}")
    P, b = prev.seen, prev.keys.shape[2]
    valid_new = (
        torch.ones(B, T, dtype=torch.bool, device=q.device) if key_padding_mask is None else key_padding_mask.bool()
    )
    keys, values = torch.cat([prev.keys, k], 2).to(dtype), torch.cat([prev.values, v], 2).to(dtype)  # stream
    valid = torch.cat([prev.valid, valid_new], 1)  # (B, b + T)

    # Exact part: the window over the stream, then the sinks that have left it.
    qg = q.to(dtype).view(B, Hk, G, T, d)
    new_sinks = max(0, min(T, sink_tokens - P))  # new tokens among the first s
    sink_k, sink_v, sink_ok = prev.sink_keys, prev.sink_values, prev.sink_valid  # (B, Hk, s', ·), (B, s')
    if new_sinks:
        sink_k = torch.cat([sink_k, k[:, :, :new_sinks]], 2)
        sink_v = torch.cat([sink_v, v[:, :, :new_sinks]], 2)
        sink_ok = torch.cat([sink_ok, valid_new[:, :new_sinks]], 1)
    if T == 1:  # decoding: one softmax over the window and the sinks that have left it
        o, log_z = decode_window_softmax(qg, keys, values, valid, sink_k, sink_v, sink_ok, P, window)
    elif window_kernel == "flex" and P == 0:  # a fresh sequence: one block-masked kernel
        o, log_z = flex_window_softmax(
            q, k, v, window=window, sink_tokens=sink_tokens, key_padding_mask=key_padding_mask
        )
    else:
        o, log_z = band_and_sinks_softmax(qg, keys, values, valid, sink_k, sink_v, sink_ok, P, b, window, chunk_size)
    o, log_z = o.reshape(B, Hq, T, -1), log_z.reshape(B, Hq, T)
    cached, cache = None, None
    if far_cache and P == 0:  # the far keys kept exact, ranked by the exact part's own rows (before the far term)
        ranked, raw = cache_scores(
            far_cache_score, q, k, log_z, valid_new, window=window, pool=far_cache_pool, chunk_size=chunk_size
        )
        cached = running_top_k(ranked, window=window, sink_tokens=sink_tokens, size=far_cache, chunk_size=chunk_size)
        cache = cache_after(k, v, log_phi_k, ranked, cached[:, :, -1], min(window, T), raw)
    elif far_cache:  # one decoding step: the token leaving the window competes for a slot, the window's masses grow
        cache = decode_step(prev, q, keys, valid, log_z, P, window, sink_tokens, far_cache_score, far_cache_pool)

    # Linear part: the key stream delayed by w tokens, sinks excluded (they stay exact).
    linear, log_phi, memory, write = prev.linear, None, prev.memory, None
    if far_write is not None:
        write = torch.cat([prev.write.to(far_write.dtype), far_write], 2) if b else far_write
    if log_phi_q is not None:
        log_phi = torch.cat([prev.log_phi_k.to(log_phi_k.dtype), log_phi_k], 2) if b else log_phi_k
        log_phi = log_phi.masked_fill(~valid[:, None, :, None], EMPTY_LOG_SCALE)
        gates = far_log_gates
        if far_decay is not None:
            gates = (0 if gates is None else gates) - far_decay[None, :, None].expand(B, Hk, T, *far_decay.shape[1:])
        far = FarPart(b, P, window, sink_tokens, chunk_size, linear_kernel)
        y_lin, log_z_lin, linear, memory = far(log_phi_q, log_phi, values, prev.linear, gates, write, memory)
        if y_lin is not None:
            if log_mix is not None:
                log_z_lin = log_z_lin + log_mix.to(log_z_lin.dtype)[None, :, None]
            o, log_z = merge_normalized(o, log_z, y_lin.to(dtype), log_z_lin.to(dtype))
    if cached is not None:  # the cached far keys: exact terms in, their far estimates (if any) out
        o, log_z = apply_far_cache(
            o, log_z, q, k, v, log_phi_q, log_phi_k, cached, window=window, log_mix=log_mix, far_decay=far_decay
        )
    elif cache is not None:
        slots = (cache.keys[:, :, None], cache.values[:, :, None], cache.log_phi[:, :, None])
        o, log_z = cached_terms(
            o,
            log_z,
            q,
            *slots[:2],
            None if log_phi_q is None else slots[2],
            log_phi_q,
            cache.positions[:, :, None],
            window=window,
            positions=torch.tensor([P], device=q.device),
            log_mix=log_mix,
            far_decay=far_decay,
        )

    keep = min(window, b + T)  # the newest w tokens stay in the window buffer
    new_state = SlidingWindowState(
        linear,
        keys[:, :, -keep:].to(k.dtype),
        values[:, :, -keep:].to(v.dtype),
        None if log_phi is None else log_phi[:, :, -keep:],
        valid[:, -keep:],
        sink_k,
        sink_v,
        sink_ok,
        P + T,
        None if write is None else write[:, :, -keep:],
        memory,
        cache,
    )
    return o.to(v.dtype), new_state
