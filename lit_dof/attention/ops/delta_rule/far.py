"""The delta rule as the far term of sliding-window attention (``far_memory="delta"``): the far values are read
from a delta-rule memory over the far term's own features, the far mass comes from their additive normaliser.

The additive far term (:mod:`lit_dof.attention.ops.sliding_window.chunked`) averages every far value under its
kernel weight, so a fixed-size state blurs what it holds as it fills (linear attention's saturation; DeltaNet,
Schlag et al. 2021, §3). Here the value of the far part is the readout of a (gated) delta-rule memory S —
``o_p = Sᵀ φ̂(q_p)`` with unit features φ̂ = φ / ‖φ‖₂, writes ``β_t`` from the token's value, the same forget gates
as the far term — which replaces what a key held instead of adding to it. Its weight in the one softmax
normaliser is the far term's estimated mass ``Σ_L κ_pt`` (the additive normaliser, ``log_z`` of
:func:`~lit_dof.attention.ops.linear.aligned.aligned_linear_attention`): the window and the sinks keep their exact
share, the far part the share the kernel estimates, and only the far *value* changes — one state of M·D floats
(the memory) plus M (the normaliser) per head, as the additive term's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_dof.attention.ops.delta_rule.chunked import chunked_delta_rule
from lit_dof.attention.ops.delta_rule.fla import fla_delta_rule
from lit_dof.attention.ops.linear.aligned import aligned_linear_attention
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE, LinearAttentionState


def unit_features(log_phi: Tensor) -> tuple[Tensor, Tensor]:
    """φ / ‖φ‖₂ from log-features, exact for any magnitude (the row's largest log-feature is taken out first).

    Args:
        log_phi: ``(B, H, N, M)`` log-features; a row at ``EMPTY_LOG_SCALE`` is an empty key.

    Returns:
        ``(features (B, H, N, M) float32, present (B, H, N) bool)``: unit rows, zero where the row is empty.
    """
    lf = log_phi.float()
    top = lf.detach().amax(-1, keepdim=True)
    present = top[..., 0] > EMPTY_LOG_SCALE / 2
    features = torch.nn.functional.normalize((lf - top).exp(), dim=-1)
    return features * present[..., None], present


def delta_far_attention(
    lq: Tensor,
    lk: Tensor,
    lv: Tensor,
    mass_state: LinearAttentionState | None,
    memory: Tensor | None,
    write: Tensor,
    *,
    chunk_size: int,
    log_gates: Tensor | None = None,
    kernel: str = "torch",
) -> tuple[Tensor, Tensor, LinearAttentionState, Tensor]:
    """The far part over N aligned queries and keys: the delta-rule readout, weighted by the additive mass.

    Args:
        lq: ``(B, Hq, N, M)`` query log-features (exact).
        lk: ``(B, Hk, N, M)`` key log-features (``EMPTY_LOG_SCALE`` rows write nothing).
        lv: ``(B, Hk, N, D)`` values.
        mass_state: the additive normaliser's state (values of width 0) referenced to index −1, or ``None``.
        memory: ``(B, Hk, M, D)`` the delta-rule memory after the preceding tokens, or ``None``.
        write: ``(B, Hk, N)`` write strengths β ∈ [0, 1] of the N keys.
        chunk_size: both kernels' chunk.
        log_gates: ``(B, Hk, N)`` the forget gates (≤ 0) of the N indices, or ``None``.
        kernel: ``"torch"`` (the chunked forms) or ``"fla"`` (flash-linear-attention's simple-GLA and gated
            delta-rule kernels, :mod:`lit_dof.attention.ops.delta_rule.fla`; N > 1).

    Returns:
        ``(y (B, Hq, N, D), log_z (B, Hq, N), mass_state, memory)``: the readouts, the far mass (``-inf``: none),
        and the two states after the last index.
    """
    _, log_z, mass_state = aligned_linear_attention(
        lq, lk, lv[..., :0], mass_state, chunk_size=chunk_size, log_gates=log_gates, kernel=kernel
    )
    keys, present = unit_features(lk)
    queries, _ = unit_features(lq)
    beta = write.float() * present
    if kernel == "fla" and lq.shape[2] > 1:
        y, memory = fla_delta_rule(queries, keys, lv, beta, log_gates, initial_state=memory)
    else:
        y, memory = chunked_delta_rule(queries, keys, lv, beta, log_gates, chunk_size=chunk_size, initial_state=memory)
    return y.float(), log_z, mass_state, memory
