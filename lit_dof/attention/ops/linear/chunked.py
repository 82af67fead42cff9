"""Chunked parallel causal linear attention — the training / prefill form.

Notation: B batch, Hq query heads, Hk key/value heads (GQA group G = Hq / Hk), T tokens, M features,
D value dim, C chunk size, N = ⌈T / C⌉ chunks.

The sequence is cut into chunks of C tokens. Inside a chunk the masked C×C kernel matrix is formed
(parallel, matmul-friendly); across chunks a prefix state A = Σ φ(k) vᵀ, B = Σ φ(k) carries the past
(METHOD.md §1, linear-time form). Cost O(T·C·(M+D) + T·M·D) instead of softmax's O(T²·D).

Numerical stability (exact, no approximation): the kernel works on log-features ℓ = log φ.
  * keys: feature f of every key in block b is scaled by exp(−m_{b,f}), m_{b,f} the running max of ℓ_{·,f}
    over all keys up to the end of block b (a per-feature constant for that block; the carried state is
    rescaled by exp(m_{b−1,f} − m_{b,f}) ≤ 1);
  * queries: feature f of query i gets exp(+m_{b,f}) back, so every product φ_f(q)φ_f(k) is unchanged;
    then the whole query row is divided by exp(r_i), r_i = max_f(ℓ_{i,f} + m_{b,f}) — a per-query
    constant that cancels between numerator and denominator.
So every exponential is ≤ 1 (no overflow for any norm) and nothing is approximated; the kernels compute in float32
whatever the input dtype, with autocast off (:func:`lit_dof.precision.fp32_region`: the same result under
``bf16-mixed``), and return the output in the values' dtype. The stabiliser m is refreshed once per *block* of chunks
(``block_size`` tokens), so a query can be scaled by a key up to one block in its future; that is exact in real
arithmetic, but if that key's feature exceeds all of the query's causal mass by more than float32's range (~87 nats of
log-feature), the row underflows. Long before that, its *gradient* overflows: the backward of y = num/den carries
1/den², which is +inf in float32 once den < ~1e-19, and inf · 0 turns the feature maps' gradients into NaN. Such blocks
are detected (row normaliser < 1e-12) and recomputed with one stabiliser per smaller chunk, recursively down to one per
token — the recurrent form's stabiliser, which is causal and keeps every row normaliser ≥ 1 (the key attaining a
feature's running max contributes exp(0) to it). Causality therefore holds exactly in real arithmetic and to float32
rounding in practice, and the gradients stay finite.

GQA: the G query heads of a group share the key features and the state, and are folded into the
query-row dimension of each chunk — keys and values are never repeated.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_dof.attention._validation import check_positive_int, check_qkv, check_rank
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE, LinearAttentionState
from lit_dof.precision import fp32_region

DEFAULT_CHUNK_SIZE = 64
"""The chunk C (tokens) of the chunked kernels where none is given, and so of the layers, students and fits built on
them: the one declaration of that default. A saved student's ``config.json`` records its own ``chunk_size``; one
that lacks it (none written by lit-dof does) gets this."""

_TINY = torch.finfo(torch.float32).tiny
_UNDERFLOW = 1e-12  # a row normaliser below this (relative to its stabiliser): 1/den² would overflow in the backward


def check_state(state: LinearAttentionState, batch: int, heads: int, feature_dim: int, value_dim: int) -> None:
    """Raise ``ValueError`` unless ``state`` has shapes ``(B, Hk, M, D)``, ``(B, Hk, M)``, ``(B, Hk, M)``."""
    want = (batch, heads, feature_dim, value_dim)
    got = (tuple(state.kv.shape), tuple(state.k_sum.shape), tuple(state.log_scale.shape))
    if got != (want, want[:3], want[:3]):
        raise ValueError(
            f"state must have kv (B, Hk, M, D) = {want} and k_sum/log_scale (B, Hk, M) = {want[:3]}, got {got}"
        )


@fp32_region()
def chunked_linear_attention(
    log_phi_q: Tensor,
    log_phi_k: Tensor,
    v: Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_size: int = 1024,
    initial_state: LinearAttentionState | None = None,
    check_inputs: bool = True,
    underflow_fallback: bool | None = None,
    return_log_normalizer: bool = False,
) -> tuple[Tensor, LinearAttentionState] | tuple[Tensor, LinearAttentionState, Tensor]:
    """Causal linear attention in chunked parallel form (differentiable).

    Computes y_i = Σ_{j≤i} K̂(q_i,k_j) v_j / Σ_{j≤i} K̂(q_i,k_j) with K̂(q,k) = Σ_f φ_f(q)φ_f(k)
    (METHOD.md §1), continuing from ``initial_state`` if given (prefill after a previous segment).
    Computed in float32 with autocast off, whatever the input dtype and the surrounding autocast.

    Args:
        log_phi_q: ``(B, Hq, T, M)`` log-features of the queries, any float dtype.
        log_phi_k: ``(B, Hk, T, M)`` log-features of the keys; ``Hq % Hk == 0``.
        v: ``(B, Hk, T, D)`` values; ``D`` may differ from ``M``.
        chunk_size: tokens per chunk C (≥ 1); T need not be a multiple of it.
        block_size: most tokens processed together (rounded down to whole chunks, at least one); the chunks
            are split into equal blocks of at most that size (padding at most one chunk per block). The key
            stabiliser is updated once per block; temporaries are ``O(B·H·block_size·M)``.
        initial_state: state after the tokens preceding this segment, or ``None`` for an empty prefix.
        check_inputs: reject NaN/+inf inputs (a reduction over the inputs; turn off in tight loops).
        underflow_fallback: recompute a block whose row normaliser underflowed with a finer stabiliser
            (exact; costs one host sync per block). ``None`` (default): on, on every device. Off, such rows
            are wrong in the forward and NaN in the backward: only for inputs known to be well scaled.
        return_log_normalizer: also return each row's log-normaliser ``log Σ_{j≤i} K̂(q_i, k_j)`` (state
            included), the quantity that lets this output be merged with other attention terms
            (:mod:`lit_dof.attention.ops.sliding_window.chunked`). Exact up to the per-query constant the log-features
            may carry; ``-inf`` for a row with no keys (its gradient is zero there).

    Returns:
        ``(y, state)``: ``y`` is ``(B, Hq, T, D)`` in the dtype of ``v``; ``state`` is the float32
        :class:`LinearAttentionState` after the last token, from which decoding can continue. With
        ``return_log_normalizer``, ``(y, state, log_z)`` with ``log_z`` ``(B, Hq, T)`` float32.

    Raises:
        ValueError: mismatched shapes, ``chunk_size < 1``, ``T == 0``, a state of the wrong shape, or NaN input.
    """
    B, Hq, Hk, T, M, D = check_qkv(log_phi_q, log_phi_k, v, finite=check_inputs)
    check_positive_int("chunk_size", chunk_size)
    check_positive_int("block_size", block_size)
    if T == 0:
        raise ValueError("the sequence length T must be >= 1")
    G = Hq // Hk
    if underflow_fallback is None:
        underflow_fallback = True
    if initial_state is None:
        initial_state = LinearAttentionState.empty(B, Hk, M, D, device=v.device)
    check_state(initial_state, B, Hk, M, D)

    C = min(chunk_size, T)
    N = math.ceil(T / C)
    # Blocks of S chunks keep every temporary cache-sized: on CPU, large fresh tensors cost more than the math.
    # The N chunks are split into equal blocks (padding at most one chunk per block).
    blocks = math.ceil(N / max(1, block_size // C))
    S = math.ceil(N / blocks)
    N = blocks * S
    pad = N * C - T
    lq, lk, vf = log_phi_q.float(), log_phi_k.float(), v.float()
    if pad:
        lq = F.pad(lq, (0, 0, 0, pad))
        lk = F.pad(lk, (0, 0, 0, pad), value=EMPTY_LOG_SCALE)  # padded keys have φ = 0
        vf = F.pad(vf, (0, 0, 0, pad))
    lq = lq.view(B, Hk, G, N, C, M)
    lk = lk.view(B, Hk, N, C, M)
    # Values block-major, (blocks, B·Hk·S, C, D): each block's chunks are one contiguous batch of matmuls.
    vb = vf.reshape(B * Hk, blocks, S * C, D)
    vb = (vb.transpose(0, 1).contiguous() if blocks > 1 else vb).reshape(blocks, B * Hk * S, C, D)

    # (S, S): strictly-lower prefix-sum operator
    exclusive = torch.ones(S, S, dtype=torch.float32, device=v.device).tril_(-1)
    # Carried state A = Σ φ(k) vᵀ, B = Σ φ(k) (METHOD.md §1), relative to the per-feature stabiliser m_ref.
    kv, k_sum, m_ref = initial_state.kv, initial_state.k_sum, initial_state.log_scale
    # Without autograd the blocks are written straight into the result (no final concatenation).
    y = None if torch.is_grad_enabled() else torch.empty(B, Hk, N, G * C, D, dtype=torch.float32, device=v.device)
    outputs, log_zs = [], []  # log_zs: (B, Hk, S, G·C, 1) per block, only with return_log_normalizer
    for b in range(blocks):
        start, stop = b * S, (b + 1) * S
        lq_blk, lk_blk = lq[:, :, :, start:stop], lk[:, :, start:stop]
        num, den, new_kv, new_k_sum, new_m, shift = _block(lq_blk, lk_blk, vb[b], kv, k_sum, m_ref, exclusive)
        if underflow_fallback and C > 1 and bool((den < _UNDERFLOW).any()):
            # Some row's mass vanished under a later key of this block: redo the block with one stabiliser
            # per (smaller) chunk; recursion ends at one token per chunk, the recurrent form's stabiliser.
            finer = max(1, C // 4)
            y_blk, state, *log_z = chunked_linear_attention(
                lq_blk.reshape(B, Hq, S * C, M),
                lk_blk.reshape(B, Hk, S * C, M),
                vb[b].view(B, Hk, S * C, D),
                chunk_size=finer,
                block_size=finer,
                initial_state=LinearAttentionState(kv, k_sum, m_ref),
                check_inputs=False,
                return_log_normalizer=return_log_normalizer,
            )
            y_blk = y_blk.view(B, Hk, G, S, C, D).transpose(2, 3).reshape(B, Hk, S, G * C, D)
            if return_log_normalizer:  # (B, Hq, S·C) -> the block layout (B, Hk, S, G·C, 1)
                log_zs.append(log_z[0].view(B, Hk, G, S, C).transpose(2, 3).reshape(B, Hk, S, G * C, 1))
            kv, k_sum, m_ref = state.kv, state.k_sum, state.log_scale
            if y is None:
                outputs.append(y_blk)
            else:
                y[:, :, start:stop] = y_blk
            continue
        kv, k_sum, m_ref = new_kv, new_k_sum, new_m
        if return_log_normalizer:
            log_zs.append(_log_normalizer(den, shift))
        inv = den.clamp_min(_TINY).reciprocal()  # one reciprocal per row, then a multiply (cheaper than a divide)
        if y is None:
            outputs.append(num * inv)  # (B, Hk, S, G·C, D)
        else:
            torch.mul(num, inv, out=y[:, :, start:stop])

    if y is None:
        y = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]  # (B, Hk, N, G·C, D)
    y = y.view(B, Hk, N, G, C, D).transpose(2, 3).reshape(B, Hq, N * C, D)[:, :, :T]
    state = LinearAttentionState(kv, k_sum, m_ref)
    if not return_log_normalizer:
        return y.to(v.dtype), state
    log_z = torch.cat(log_zs, dim=2) if len(log_zs) > 1 else log_zs[0]  # (B, Hk, N, G·C, 1)
    log_z = log_z.view(B, Hk, N, G, C).transpose(2, 3).reshape(B, Hq, N * C)[:, :, :T]
    return y.to(v.dtype), state, log_z


def _log_normalizer(den: Tensor, shift: Tensor) -> Tensor:
    """``log(den) + shift`` with ``-inf`` (and a zero gradient) where a row has no mass at all."""
    safe = den.clamp_min(_TINY).log()
    return torch.where(den > 0, safe, torch.full_like(safe, float("-inf"))) + shift


def _block(
    lq: Tensor, lk: Tensor, v: Tensor, kv: Tensor, k_sum: Tensor, m_ref: Tensor, exclusive: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One block of n chunks. lq ``(B, Hk, G, n, C, M)``, lk ``(B, Hk, n, C, M)``, v ``(B·Hk·n, C, D)``
    float32, the carried state kv ``(B, Hk, M, D)`` and k_sum ``(B, Hk, M)`` relative to m_ref ``(B, Hk, M)``.

    Returns ``(num (B, Hk, n, G·C, D), den (B, Hk, n, G·C, 1), kv, k_sum, m_ref, shift (B, Hk, n, G·C, 1))``:
    numerators and denominators of the block's rows, the state after the block relative to the new
    stabiliser, and the per-row constant r_i taken out of the queries (``log`` of the true normaliser is
    ``log(den) + shift``).
    Numerator and denominator are separate matmuls so that every matmul is D (not D + 1) wide.
    """
    B, Hk, G, n, C, M = lq.shape
    D = v.shape[-1]
    BH = B * Hk
    with torch.no_grad():
        m_new = torch.maximum(m_ref, lk.amax(dim=(2, 3)))  # running max at the block's end, (B, Hk, M)
        decay = torch.exp(m_ref - m_new)  # ≤ 1, rescales the carried state
    k_hat = (lk - m_new[:, :, None, None, :]).exp_().view(BH * n, C, M)  # every entry ≤ 1
    shifted = lq.transpose(2, 3) + m_new[:, :, None, None, None, :]  # (B, Hk, n, G, C, M)
    row_shift = shifted.detach().amax(dim=-1, keepdim=True)  # (B, Hk, n, G, C, 1)
    q_hat = shifted.sub_(row_shift).exp_()  # row max 1; the shift cancels
    q_hat = q_hat.reshape(BH * n, G * C, M)  # GQA: the group's queries are extra rows of the chunk

    # Intra-chunk: masked C×C kernel block (row g·C + i attends to columns j ≤ i).
    scores = torch.bmm(q_hat, k_hat.transpose(-1, -2))  # (BHn, G·C, C)
    scores = scores.view(BH * n, G, C, C).tril_().view(BH * n, G * C, C)
    num = torch.bmm(scores, v)  # (BHn, G·C, D)
    den = scores.sum(-1, keepdim=True)  # (BHn, G·C, 1)

    # Inter-chunk: the state before each chunk = carried state + exclusive prefix sum of chunk states.
    chunk_kv = torch.bmm(k_hat.transpose(-1, -2), v).view(BH, n, M * D)
    chunk_k = k_hat.sum(1).view(BH, n, M)
    ops = exclusive[:n, :n]
    prefix_kv = (ops @ chunk_kv).view(B, Hk, n, M, D).add_((kv * decay.unsqueeze(-1)).unsqueeze(2))
    prefix_k = (ops @ chunk_k).view(B, Hk, n, M).add_((k_sum * decay).unsqueeze(2))
    num = num.baddbmm_(q_hat, prefix_kv.view(BH * n, M, D)).view(B, Hk, n, G * C, D)
    den = den.baddbmm_(q_hat, prefix_k.view(BH * n, M, 1)).view(B, Hk, n, G * C, 1)
    kv = prefix_kv[:, :, -1] + chunk_kv.view(B, Hk, n, M, D)[:, :, -1]
    k_sum = prefix_k[:, :, -1] + chunk_k.view(B, Hk, n, M)[:, :, -1]
    return num, den, kv, k_sum, m_new, row_shift.reshape(B, Hk, n, G * C, 1)


@fp32_region()
def accumulate_state(
    log_phi_k: Tensor, v: Tensor, *, initial_state: LinearAttentionState | None = None
) -> LinearAttentionState:
    """Fold keys and values into the recurrent state without computing any output (a prefix summary).

    The same state :func:`chunked_linear_attention` would return after these tokens:
    ``m_f = max(m⁰_f, max_j ℓ_{j,f})``, ``kv = e^{m⁰−m}·kv⁰ + Σ_j e^{ℓ_j − m} v_jᵀ``, ``k_sum`` likewise
    (:class:`~lit_dof.attention.ops.linear.state.LinearAttentionState`). Used when the queries of a prefix are not
    needed, e.g. a softmax-style KV cache handed to a linear layer.

    Args:
        log_phi_k: ``(B, H, P, M)`` key log-features (``EMPTY_LOG_SCALE`` marks a padded key).
        v: ``(B, H, P, D)`` values.
        initial_state: state before these P tokens, or ``None``.

    Returns:
        the float32 :class:`LinearAttentionState` after the P tokens (computed in float32, autocast off).

    Raises:
        ValueError: mismatched shapes or a state of the wrong shape.
    """
    check_rank("log_phi_k", log_phi_k, 4, "(B, H, P, M)")
    check_rank("v", v, 4, "(B, H, P, D)")
    B, H, P, M = log_phi_k.shape
    if v.shape[:3] != (B, H, P):
        raise ValueError(f"v {tuple(v.shape)} does not match log_phi_k {tuple(log_phi_k.shape)} in (B, H, P)")
    D = v.shape[-1]
    state = initial_state if initial_state is not None else LinearAttentionState.empty(B, H, M, D, device=v.device)
    check_state(state, B, H, M, D)
    lk = log_phi_k.float()
    with torch.no_grad():
        m_new = torch.maximum(state.log_scale, lk.amax(dim=2))  # (B, H, M)
        decay = torch.exp(state.log_scale - m_new)
    w = torch.exp(lk - m_new.unsqueeze(2))  # (B, H, P, M), ≤ 1
    kv = state.kv * decay.unsqueeze(-1) + w.transpose(-1, -2) @ v.float()
    k_sum = state.k_sum * decay + w.sum(dim=2)
    return LinearAttentionState(kv, k_sum, m_new)
