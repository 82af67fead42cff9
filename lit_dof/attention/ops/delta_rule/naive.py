"""Sequential float64 reference for the gated delta rule — the ground truth the chunked form is tested against.

Per head, a state S ∈ R^{M×D} and, for t = 1…N (DeltaNet, Schlag et al. 2021 / Yang et al. 2024, §2; its gated form,
Gated DeltaNet, Yang et al. 2025, §3)::

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ        o_t = S_tᵀ q_t

with unit keys k_t (so I − β_t k_t k_tᵀ has eigenvalues in [1 − β_t, 1]), write strengths β_t ∈ [0, 1] and forget
gates α_t = e^{g_t} ∈ (0, 1]. With β_t = 1 the memory replaces what k_t held by v_t; β_t = 0 leaves it alone.
"""

from __future__ import annotations

import torch
from torch import Tensor


def naive_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_gates: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule token by token, in float64 (the module's recurrence).

    Args:
        q: ``(B, Hq, N, M)`` readout queries; ``Hq % Hk == 0`` (the G query heads of a group read one state).
        k: ``(B, Hk, N, M)`` keys (unit norm for a stable memory; not checked here).
        v: ``(B, Hk, N, D)`` values.
        beta: ``(B, Hk, N)`` write strengths β.
        log_gates: ``(B, Hk, N)`` g = log α ≤ 0, or ``None`` (α = 1).
        initial_state: ``(B, Hk, M, D)`` S_0, or ``None`` (zeros).

    Returns:
        ``(o (B, Hq, N, D), S_N (B, Hk, M, D))`` in float64.
    """
    B, Hq, N, M = q.shape
    Hk, D = k.shape[1], v.shape[-1]
    G = Hq // Hk
    S = q.new_zeros(B, Hk, M, D, dtype=torch.float64) if initial_state is None else initial_state.double()
    qg = q.double().view(B, Hk, G, N, M)
    outputs = []
    for t in range(N):
        kt, vt, bt = k[:, :, t].double(), v[:, :, t].double(), beta[:, :, t].double()
        if log_gates is not None:
            S = S * log_gates[:, :, t].double().exp()[..., None, None]
        delta = vt - torch.einsum("bhm,bhmd->bhd", kt, S)  # what the memory misses at k_t
        S = S + torch.einsum("bhm,bhd->bhmd", kt, bt[..., None] * delta)
        outputs.append(torch.einsum("bhgm,bhmd->bhgd", qg[:, :, :, t], S))
    return torch.stack(outputs, 3).reshape(B, Hq, N, D), S
