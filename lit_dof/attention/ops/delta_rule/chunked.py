"""Chunked parallel form of the gated delta rule — the training / prefill form.

Notation: B batch, Hq query heads, Hk key/value heads (G = Hq / Hk), N tokens, M key size (the state's rows), D
value size, C chunk size. The recurrence (:mod:`~lit_dof.attention.ops.delta_rule.naive`)::

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,        o_t = S_tᵀ q_t

is a sum of rank-one writes S_t = e^{c_t} S_0 + Σ_{j≤t} e^{c_t − c_j} k_j u_jᵀ (c_t = Σ_{i≤t} g_i inside a chunk)
with pseudo-values u_t = β_t (v_t − α_t S_{t−1}ᵀ k_t), which solve one unit lower-triangular system per chunk —
the WY / UT form of DeltaNet (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length", §3.2; gated: Yang et al. 2025, §3.3)::

    (I + L) U = diag(β) V − diag(β e^{c}) K S_0,     L = strictly-lower(diag(β) (K Kᵀ ⊙ Γ)),  Γ_tj = e^{c_t − c_j}

so U = Ũ − W S_0 with Ũ = (I + L)⁻¹ diag(β) V and W = (I + L)⁻¹ diag(β e^{c}) K, computed for all chunks at once;
only ``U``, the outputs ``O = diag(e^{c}) Q S_0 + (tril(Q Kᵀ) ⊙ Γ) U`` and the next state
``S_C = e^{c_C} S_0 + (K ⊙ e^{c_C − c})ᵀ U`` run chunk after chunk. Every exponent is ≤ 0 and, with unit keys and
β ∈ [0, 1], L's entries lie in [0, 1]: nothing overflows. Float32 with autocast off, whatever the input dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_dof.attention._validation import check_positive_int
from lit_dof.precision import fp32_region


def check_delta_inputs(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_gates: Tensor | None) -> None:
    """Raise ``ValueError`` unless the shapes are ``q (B, Hq, N, M)``, ``k (B, Hk, N, M)``, ``v (B, Hk, N, D)``,
    ``beta`` and ``log_gates`` ``(B, Hk, N)`` with ``Hq % Hk == 0``."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-d (B, H, N, ·), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, N, M = q.shape
    Hk = k.shape[1]
    if k.shape != (B, Hk, N, M) or v.shape[:3] != (B, Hk, N) or Hq % Hk:
        raise ValueError(
            f"expected q (B, Hq, N, M), k (B, Hk, N, M), v (B, Hk, N, D) with Hq % Hk == 0, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    for name, x in (("beta", beta), ("log_gates", log_gates)):
        if x is not None and tuple(x.shape) != (B, Hk, N):
            raise ValueError(f"{name} must have shape (B, Hk, N) = {(B, Hk, N)}, got {tuple(x.shape)}")


@fp32_region()
def chunked_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_gates: Tensor | None = None,
    *,
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule over N tokens in chunked parallel form (differentiable).

    Args:
        q: ``(B, Hq, N, M)`` readout queries; the G = Hq / Hk query heads of a group read one state (GQA, keys
            never repeated).
        k: ``(B, Hk, N, M)`` keys, unit norm (or zero: a key that writes nothing).
        v: ``(B, Hk, N, D)`` values.
        beta: ``(B, Hk, N)`` write strengths β ∈ [0, 1] (0: the token leaves the memory alone, e.g. padding).
        log_gates: ``(B, Hk, N)`` g = log α ≤ 0 of each token, or ``None`` (α = 1: DeltaNet).
        chunk_size: tokens per chunk C (≥ 1); N need not be a multiple of it.
        initial_state: ``(B, Hk, M, D)`` the state after the preceding tokens, or ``None`` (zeros).

    Returns:
        ``(o (B, Hq, N, D) in v's dtype, S (B, Hk, M, D) float32)``: the readouts and the state after the last
        token, from which a later call continues.

    Raises:
        ValueError: inconsistent shapes or ``chunk_size < 1``.
    """
    check_delta_inputs(q, k, v, beta, log_gates)
    check_positive_int("chunk_size", chunk_size)
    B, Hq, N, M = q.shape
    Hk, D = k.shape[1], v.shape[-1]
    G = Hq // Hk
    C = min(chunk_size, N)
    n = math.ceil(N / C)
    pad = n * C - N
    qf, kf, vf, bf = q.float(), k.float(), v.float(), beta.float()
    gf = torch.zeros_like(bf) if log_gates is None else log_gates.float()
    if pad:  # padded tokens write nothing (β = 0, k = 0) and forget nothing (g = 0)
        qf, kf, vf = (F.pad(x, (0, 0, 0, pad)) for x in (qf, kf, vf))
        bf, gf = F.pad(bf, (0, pad)), F.pad(gf, (0, pad))
    Q = qf.view(B, Hk, G, n, C, M).transpose(2, 3).reshape(B, Hk, n, G * C, M)  # the group's queries are rows
    K, V = kf.view(B, Hk, n, C, M), vf.view(B, Hk, n, C, D)
    beta_c = bf.view(B, Hk, n, C, 1)
    c = gf.view(B, Hk, n, C).cumsum(-1)  # c_t inside each chunk, ≤ 0 and non-increasing
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    gamma = (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # (B, Hk, n, C, C)

    # UT transform of every chunk at once: Ũ = (I + L)⁻¹ diag(β) V, W = (I + L)⁻¹ diag(β e^{c}) K.
    eye = torch.eye(C, dtype=torch.float32, device=q.device)
    lower = (beta_c * (K @ K.transpose(-1, -2)) * gamma).tril(-1)
    system = eye + lower
    rhs = torch.cat([beta_c * V, beta_c * c.exp()[..., None] * K], -1)  # (B, Hk, n, C, D + M)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    U_tilde, W = solved[..., :D], solved[..., D:]

    gamma_q = gamma.repeat(1, 1, 1, G, 1)  # (B, Hk, n, G·C, C): row g·C + i of the group's chunk is query i
    scores = (Q @ K.transpose(-1, -2)) * gamma_q  # masked by Γ (0 above the diagonal)
    q_decay = c.exp().repeat(1, 1, 1, G)[..., None]  # (B, Hk, n, G·C, 1)
    k_decay = (c[..., -1:] - c).exp()[..., None]  # (B, Hk, n, C, 1): e^{c_C − c_j}
    chunk_decay = c[..., -1].exp()[..., None, None]  # (B, Hk, n, 1, 1)

    S = q.new_zeros(B, Hk, M, D, dtype=torch.float32) if initial_state is None else initial_state.float()
    outputs = []
    for i in range(n):
        U = U_tilde[:, :, i] - W[:, :, i] @ S  # (B, Hk, C, D)
        outputs.append(q_decay[:, :, i] * (Q[:, :, i] @ S) + scores[:, :, i] @ U)
        S = chunk_decay[:, :, i] * S + (K[:, :, i] * k_decay[:, :, i]).transpose(-1, -2) @ U
    o = torch.stack(outputs, 2)  # (B, Hk, n, G·C, D)
    o = o.view(B, Hk, n, G, C, D).transpose(2, 3).reshape(B, Hq, n * C, D)[:, :, :N]
    return o.to(v.dtype), S
