"""Gated causal linear attention over aligned queries and keys — the far term's kernel.

Notation as :mod:`~lit_dof.attention.ops.linear.chunked`; N aligned indices (query n and key n are one pair).

Query n sees keys m ≤ n and a carried state, each key's term weighted by the forget gates of the indices after
it::

    y_n = Σ_{m≤n} e^{c_n − c_m} K̂(q_n, k_m) v_m / Σ_{m≤n} e^{c_n − c_m} K̂(q_n, k_m),   c_n = Σ_{i≤n} g_i

with ``g_i ≤ 0`` the log forget gate of index i: a constant ``−λ`` per head is RetNet's scalar decay (Sun et al.
2023, §2.1), a data-dependent one per head and token the scalar gate of Mamba-2 (Dao & Gu 2024, §3) and of simple
GLA (Yang et al. 2024, as flash-linear-attention's ``chunk_simple_gla``); ``None`` is plain linear attention. The
carried state's terms get ``e^{c_n}``: it is referenced to index −1, the last index of the call before.

The gate needs no kernel of its own: ``e^{c_n − c_m}`` is an offset of the query log-features (``+c_n``) and of the
key log-features (``−c_m``) per head — or per feature, for GLA's per-channel gate (Yang et al. 2024, §4) —, exact,
with the linear kernel's stabilisers absorbing the offsets. Offsets are taken from the start of segments of at most
:data:`SEGMENT` tokens whose gates sum to at most :data:`SPAN` nats (one host sync for the fastest gate of the call),
so float32 keeps them exact to about 1e-6 and the kernel's per-block stabiliser does not underflow a row; the state
carried from one segment to the next is re-referenced by a shift of its per-feature log-scale (:func:`rereference`),
so it stays finite at any context length.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from lit_dof.attention.ops.linear.chunked import chunked_linear_attention
from lit_dof.attention.ops.linear.fla import fla_aligned_linear_attention
from lit_dof.attention.ops.linear.recurrent import recurrent_linear_attention
from lit_dof.attention.ops.linear.state import LinearAttentionState

SEGMENT = 512
"""Most tokens per kernel call under a gate."""

SPAN = 16.0
"""Nats: a segment's log-feature offsets stay within this (float32 keeps them to ~1e-6)."""


def aligned_linear_attention(
    lq: Tensor,
    lk: Tensor,
    lv: Tensor,
    state: LinearAttentionState | None,
    *,
    chunk_size: int,
    log_gates: Tensor | None = None,
    kernel: str = "torch",
) -> tuple[Tensor, Tensor, LinearAttentionState]:
    """Gated causal linear attention of N queries over N aligned keys (the module's equation).

    Args:
        lq: ``(B, Hq, N, M)`` query log-features (exact, or up to a per-row constant).
        lk: ``(B, Hk, N, M)`` key log-features (``EMPTY_LOG_SCALE`` for keys that must not count).
        lv: ``(B, Hk, N, D)`` values.
        state: the carried state ``(B, Hk, M, ·)`` referenced to index −1, or ``None``.
        chunk_size: the chunked kernel's chunk C.
        log_gates: ``(B, Hk, N)`` g ≤ 0, the log forget gate of each index in nats, or ``(B, Hk, N, M)``, one per
            feature (GLA's per-channel gate: feature f of key m weighs e^{c_nf − c_mf}), or ``None`` (no gate).
        kernel: ``"torch"`` (the chunked kernel; the recurrent form for N = 1) or ``"fla"``
            (:func:`~lit_dof.attention.ops.linear.fla.fla_aligned_linear_attention`, same contract, for N > 1;
            a gate per head only).

    Returns:
        ``(y (B, Hq, N, D), log_z (B, Hq, N), state)``: outputs, their log-normalisers (``-inf`` for a query with
        no key) and the state after the last index, referenced to it (the next call's index −1).
    """
    N = lq.shape[2]
    per_feature = log_gates is not None and log_gates.dim() == 4
    if kernel == "fla" and N > 1:
        if per_feature:
            raise ValueError(
                "the fla far-term kernel takes one gate per head (chunk_simple_gla); a decay per feature runs on "
                "linear_kernel='torch'"
            )
        return fla_aligned_linear_attention(lq, lk, lv, state, log_gates)
    step = N
    if log_gates is not None and N > chunk_size:  # segments whose gates sum to ≤ SPAN nats
        fastest = float(-log_gates.detach().min())
        span = SEGMENT if fastest <= 0 else int(SPAN / fastest) // chunk_size * chunk_size
        step = max(chunk_size, min(SEGMENT, span))
    group = lq.shape[1] // lk.shape[1]
    ys, log_zs = [], []
    for start in range(0, N, step):
        q_s, k_s, v_s = (x[:, :, start : start + step] for x in (lq, lk, lv))
        c = None
        if log_gates is not None:
            c = log_gates[:, :, start : start + step].float().cumsum(2)  # (B, Hk, n[, M]), c_n of the segment
            c = c if per_feature else c[..., None]  # (B, Hk, n, M or 1)
            k_s = k_s.float() - c
            q_s = q_s.float() + c.repeat_interleave(group, 1)
        call = (
            recurrent_linear_attention
            if q_s.shape[2] == 1
            else partial(chunked_linear_attention, chunk_size=chunk_size)
        )
        y, state, log_z = call(q_s, k_s, v_s, initial_state=state, check_inputs=False, return_log_normalizer=True)
        if c is not None:
            state = rereference(state, -c[:, :, -1])  # (B, Hk, M or 1)
        ys.append(y)
        log_zs.append(log_z)
    if len(ys) == 1:
        return ys[0], log_zs[0], state
    return torch.cat(ys, 2), torch.cat(log_zs, 2), state


def rereference(state: LinearAttentionState, shift: Tensor) -> LinearAttentionState:
    """The state with every key's weight multiplied by e^{−shift} (in every feature, or feature by feature).

    In value a shift of the per-feature log-scale, which the kernels treat as a constant stabiliser; the gradient
    with respect to ``shift`` goes through a factor e^{sg(shift) − shift} = 1 on the accumulators.

    Args:
        state: a :class:`~lit_dof.attention.ops.linear.state.LinearAttentionState` ``(B, H, M, D)``.
        shift: ``(B, H)`` or ``(B, H, M)`` nats.

    Returns:
        The re-referenced state (same shapes).
    """
    shift = shift if shift.dim() == 3 else shift[..., None]  # (B, H, M or 1)
    log_scale = state.log_scale - shift.detach()
    if not (torch.is_grad_enabled() and shift.requires_grad):
        return LinearAttentionState(state.kv, state.k_sum, log_scale)
    factor = torch.exp(shift.detach() - shift)  # 1, with d/dshift = −1
    return LinearAttentionState(state.kv * factor[..., None], state.k_sum * factor, log_scale)
