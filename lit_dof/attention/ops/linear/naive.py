"""Quadratic reference for causal linear attention — the ground truth the fast forms are tested against.

For positive features φ the normalised linear-attention row of query i is (METHOD.md §1)::

    y_i = Σ_{j≤i} K̂(q_i, k_j) v_j / Σ_{j≤i} K̂(q_i, k_j),     K̂(q, k) = Σ_f φ_f(q) φ_f(k)

which is exactly a causal softmax over the logits ``log K̂(q_i, k_j) = logsumexp_f(log φ_f(q_i) + log φ_f(k_j))``.
Working with that identity keeps the reference exact for any feature magnitude.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_dof.attention._validation import check_qkv


def log_kernel_matrix(log_phi_q: Tensor, log_phi_k: Tensor) -> Tensor:
    """``log K̂(q_i, k_j) = logsumexp_f(log φ_f(q_i) + log φ_f(k_j))`` for all pairs.

    Args:
        log_phi_q: ``(B, H, T, M)``.
        log_phi_k: ``(B, H, S, M)`` with the same ``H`` (repeat GQA keys first).

    Returns:
        ``(B, H, T, S)`` in the input dtype. Memory is ``O(B·H·T·S·M)``: for tests and small inputs only.
    """
    return torch.logsumexp(log_phi_q.unsqueeze(-2) + log_phi_k.unsqueeze(-3), dim=-1)


def naive_linear_attention(log_phi_q: Tensor, log_phi_k: Tensor, v: Tensor, *, causal: bool = True) -> Tensor:
    """Reference (quadratic) linear attention: the masked K̂ matrix with normalised rows.

    Args:
        log_phi_q: ``(B, Hq, T, M)`` log-features of the queries.
        log_phi_k: ``(B, Hk, T, M)`` log-features of the keys, ``Hq % Hk == 0`` (GQA; keys are repeated here,
            which the fast forms avoid).
        v: ``(B, Hk, T, D)`` values.
        causal: mask keys after the query (default) or attend to the whole sequence.

    Returns:
        ``(B, Hq, T, D)`` in the dtype of ``v``; computed in float64 internally.

    Raises:
        ValueError: on mismatched shapes or NaN input (see :func:`lit_dof.attention._validation.check_qkv`).
    """
    _, Hq, Hk, T, _, _ = check_qkv(log_phi_q, log_phi_k, v)
    group = Hq // Hk
    lk = log_phi_k.double().repeat_interleave(group, dim=1)  # (B, Hq, T, M)
    vv = v.double().repeat_interleave(group, dim=1)  # (B, Hq, T, D)
    logits = log_kernel_matrix(log_phi_q.double(), lk)  # (B, Hq, T, T)
    if causal:
        future = torch.ones(T, T, dtype=torch.bool, device=v.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    return (torch.softmax(logits, dim=-1) @ vv).to(v.dtype)
