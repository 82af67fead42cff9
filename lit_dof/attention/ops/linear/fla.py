"""The far term on flash-linear-attention's simple-GLA kernels (``linear_kernel="fla"``; ``pip install
lit-dof[gpu]``).

The far term of :mod:`lit_dof.attention.ops.sliding_window.chunked` is causal linear attention of N queries over N
aligned keys with a scalar forget gate per head and token, e^{c_n − c_m} (:mod:`~lit_dof.attention.ops.linear.aligned`)
— simple gated linear attention (GLA, Yang et al. 2024, as fla's ``chunk_simple_gla``; a constant gate ``g = −λ`` is
RetNet's decay, Sun et al. 2023, §2.1). What fla does not carry is our representation: log-features, a normaliser
and a state with per-feature log-scales. The mapping, exact in real arithmetic, per segment of ≤ 512 tokens:

* key features ``exp(ℓ_k − c_f)`` with ``c_f`` the largest key log-feature of the segment (or of the carried
  state) in feature f, so every key feature is ≤ 1; the same ``c_f`` is added to the query log-features, and
  each query row is divided by its largest entry ``a_n``, so no feature overflows;
* the normaliser as a column of ones appended to the values: one kernel call gives numerator and denominator,
  ``log_z = log(den) + a_n``;
* the carried :class:`~lit_dof.attention.ops.linear.state.LinearAttentionState` (referenced to index −1, as fla's
  initial state is) enters in the scale ``c``, and the final state comes back with ``log_scale = c``.

One ``c`` serves the whole segment: where a later key of the segment exceeds an earlier key's (or the carried
state's) log-feature by more than float32's range (~87 nats), the earlier terms underflow here, while the PyTorch
path's finer stabilisers keep them (:mod:`~lit_dof.attention.ops.linear.chunked`).
``c`` and ``a_n`` are constants of the exact function (its value does not depend on them), so they carry no
gradient. Grouped-query attention repeats the KV features for the query heads (fla's simple GLA has one head
count). On CUDA the kernel is fla's Triton ``chunk_simple_gla``; elsewhere fla's own pure-PyTorch reference
``naive_chunk_simple_gla`` (slow; what the CPU tests run, so the wiring is proven without a GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lit_dof.attention.ops.linear.state import LinearAttentionState

SEGMENT = 512  # tokens per kernel call: the stabilisers c are per segment
_INSTALL = "the fla far-term kernel needs flash-linear-attention: pip install 'lit-dof[gpu]' (needs triton)"


def fla_kernel(device: torch.device) -> Callable:
    """fla's simple-GLA kernel for ``device``: the Triton ``chunk_simple_gla`` on CUDA, else fla's pure-PyTorch
    ``naive_chunk_simple_gla``, both as ``kernel(q, k, v, g, scale, initial_state, output_final_state) -> (o,
    final_state)`` in fla's ``(B, T, H, ·)`` layout. fla's own arguments are passed by name: ``chunk_simple_gla``'s
    fifth positional argument is ``g_gamma`` (a per-head constant decay) since fla 0.2, not ``scale``.

    Raises:
        ImportError: flash-linear-attention (or triton) is not installed, with the command that installs it.
    """
    try:
        if device.type == "cuda":
            from fla.ops.simple_gla import chunk_simple_gla

            def kernel(q, k, v, g, scale, initial_state, output_final_state):
                return chunk_simple_gla(
                    q, k, v, g=g, scale=scale, initial_state=initial_state, output_final_state=output_final_state
                )

            return kernel
        from fla.ops.simple_gla.naive import naive_chunk_simple_gla
    except ImportError as exc:
        raise ImportError(f"{_INSTALL} ({exc})") from exc

    def naive(q, k, v, g, scale, initial_state, output_final_state):
        return naive_chunk_simple_gla(
            q, k, v, g=g, initial_state=initial_state, output_final_state=output_final_state, scale=scale
        )

    return naive


def fla_aligned_linear_attention(
    lq: Tensor,
    lk: Tensor,
    lv: Tensor,
    state: LinearAttentionState | None,
    log_gates: Tensor | None,
    *,
    kernel: Callable | None = None,
) -> tuple[Tensor, Tensor, LinearAttentionState]:
    """Gated causal linear attention of N queries over N aligned keys (query n sees keys m ≤ n and ``state``), each
    term weighted e^{c_n − c_m}, by fla's simple-GLA kernel.

    The contract of the PyTorch path (:func:`~lit_dof.attention.ops.linear.aligned.aligned_linear_attention`):
    ``state`` referenced to index −1, the returned state to index N − 1.

    Args:
        lq: ``(B, Hq, N, M)`` query log-features (exact, or up to a per-row constant).
        lk: ``(B, Hk, N, M)`` key log-features (``EMPTY_LOG_SCALE`` for keys that must not count).
        lv: ``(B, Hk, N, D)`` values.
        state: the carried state ``(B, Hk, M, ·)``, or ``None``.
        log_gates: ``(B, Hk, N)`` g ≤ 0, the log forget gate of each index in nats, or ``None`` (no gate).
        kernel: fla's kernel (default :func:`fla_kernel` for the inputs' device).

    Returns:
        ``(y (B, Hq, N, D), log_z (B, Hq, N), state)`` in float32; a query with no key gives ``y = 0``,
        ``log_z = -inf``.

    Raises:
        ImportError: no fla (see :func:`fla_kernel`).
    """
    kernel = kernel or fla_kernel(lq.device)
    Hq, N, Hk = lq.shape[1], lq.shape[2], lk.shape[1]
    G = Hq // Hk
    gates = lq.new_zeros(lq.shape[0], Hk, N) if log_gates is None else log_gates
    ys, log_zs = [], []
    for start in range(0, N, SEGMENT):
        q_s, k_s, v_s, g_s = (x[:, :, start : start + SEGMENT].float() for x in (lq, lk, lv, gates))
        y, log_z, state = _segment(q_s, k_s, v_s, state, g_s, G, kernel)
        ys.append(y)
        log_zs.append(log_z)
    return torch.cat(ys, 2), torch.cat(log_zs, 2), state


def _segment(
    lq: Tensor, lk: Tensor, lv: Tensor, state: LinearAttentionState | None, gates: Tensor, G: int, kernel: Callable
) -> tuple[Tensor, Tensor, LinearAttentionState]:
    """One kernel call over ≤ :data:`SEGMENT` tokens (the mapping of the module docstring); ``gates`` ``(B, Hk, n)``."""
    B, Hk, n, _ = lk.shape
    D = lv.shape[-1]
    c = lk.detach().amax(2)  # (B, Hk, M)
    if state is not None:
        c = torch.maximum(c, state.log_scale)
    c = c.clamp_min(-1e4)  # a feature no key has touched: any finite scale (its key features are all 0)
    phi_k = (lk - c[:, :, None]).exp()  # ≤ 1
    lq_c = lq + c.repeat_interleave(G, 1)[:, :, None]
    a = lq_c.detach().amax(-1, keepdim=True).clamp_min(-1e4)  # (B, Hq, n, 1)
    phi_q = (lq_c - a).exp()  # ≤ 1
    v1 = torch.cat([lv, lv.new_ones(B, Hk, n, 1)], -1)  # values and the normaliser's ones
    h0 = None
    if state is not None:
        scale = (state.log_scale - c).exp()[..., None]  # ≤ 1
        h0 = (torch.cat([state.kv, state.k_sum[..., None]], -1) * scale).repeat_interleave(G, 1)
    g = gates.repeat_interleave(G, 1).transpose(1, 2).contiguous()  # (B, n, Hq)

    def layout(x: Tensor) -> Tensor:  # (B, H, n, ·) → fla's (B, n, H, ·)
        return x.transpose(1, 2).contiguous()

    o, ht = kernel(
        layout(phi_q), layout(phi_k.repeat_interleave(G, 1)), layout(v1.repeat_interleave(G, 1)), g, 1.0, h0, True
    )
    o = o.transpose(1, 2).float()  # (B, Hq, n, D + 1)
    num, den = o[..., :D], o[..., D]
    seen = den > 0
    y = num / torch.where(seen, den, torch.ones_like(den))[..., None]
    log_z = torch.where(seen, den.clamp_min(torch.finfo(torch.float32).tiny).log(), float("-inf")) + a[..., 0]
    ht = ht.float()[:, ::G]  # (B, Hk, M, D + 1): the group's copies are equal
    new_state = LinearAttentionState(ht[..., :D], ht[..., D], c)
    return y, log_z, new_state
