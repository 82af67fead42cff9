"""The delta-rule memory on flash-linear-attention's gated delta-rule kernels (``linear_kernel="fla"``; ``pip install
'lit-dof[gpu]'``).

fla's ``chunk_gated_delta_rule`` (Gated DeltaNet, Yang et al. 2025) computes the recurrence of
:mod:`~lit_dof.attention.ops.delta_rule.naive` — ``S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ``,
``o_t = S_tᵀ q_t`` — in fla's ``(B, T, H, ·)`` layout, with ``g = log α`` and its initial state in our orientation
``(B, H, M, D)``. It has one head count for queries and keys, so the keys, values, writes and gates of a KV group are
repeated for its G query heads; the G copies of the final state are equal, and the first is returned. On CUDA the
kernel is fla's Triton ``chunk_gated_delta_rule``; elsewhere its own pure-PyTorch ``naive_recurrent_gated_delta_rule``
(slow; what the CPU tests run, so the wiring is proven without a GPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_INSTALL = "the fla delta-rule kernel needs flash-linear-attention: pip install 'lit-dof[gpu]' (needs triton)"


def fla_delta_kernel(device: torch.device) -> Callable:
    """fla's gated delta-rule kernel for ``device``, as ``kernel(q, k, v, beta, g, initial_state) -> (o, state)`` in
    fla's ``(B, T, H, ·)`` layout (scale 1, final state returned).

    Raises:
        ImportError: flash-linear-attention (or triton) is not installed, with the command that installs it.
    """
    try:
        if device.type == "cuda":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            def kernel(q, k, v, beta, g, initial_state):
                return chunk_gated_delta_rule(
                    q, k, v, g, beta, scale=1.0, initial_state=initial_state, output_final_state=True
                )

            return kernel
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    except ImportError as exc:
        raise ImportError(f"{_INSTALL} ({exc})") from exc

    def naive(q, k, v, beta, g, initial_state):
        return naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale=1.0, initial_state=initial_state, output_final_state=True
        )

    return naive


def fla_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_gates: Tensor | None = None,
    *,
    initial_state: Tensor | None = None,
    kernel: Callable | None = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule by fla's kernel, with the contract of
    :func:`~lit_dof.attention.ops.delta_rule.chunked.chunked_delta_rule` (shapes, GQA, state).

    Args:
        q: ``(B, Hq, N, M)`` readout queries.
        k: ``(B, Hk, N, M)`` unit keys.
        v: ``(B, Hk, N, D)`` values.
        beta: ``(B, Hk, N)`` write strengths.
        log_gates: ``(B, Hk, N)`` log forget gates, or ``None``.
        initial_state: ``(B, Hk, M, D)``, or ``None``.
        kernel: fla's kernel (default :func:`fla_delta_kernel` for the inputs' device).

    Returns:
        ``(o (B, Hq, N, D) float32, S (B, Hk, M, D) float32)``.

    Raises:
        ImportError: no fla (see :func:`fla_delta_kernel`).
    """
    kernel = kernel or fla_delta_kernel(q.device)
    group = q.shape[1] // k.shape[1]
    gates = torch.zeros_like(beta) if log_gates is None else log_gates

    def heads(x: Tensor) -> Tensor:  # the group's copies, in fla's (B, N, H, ·) layout
        return x.float().repeat_interleave(group, 1).transpose(1, 2).contiguous()

    state = None if initial_state is None else initial_state.float().repeat_interleave(group, 1)
    o, final = kernel(q.float().transpose(1, 2).contiguous(), heads(k), heads(v), heads(beta), heads(gates), state)
    return o.transpose(1, 2).float(), final.float()[:, ::group]
