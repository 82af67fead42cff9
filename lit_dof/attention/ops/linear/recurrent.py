"""Recurrent (token-by-token) causal linear attention — the decoding form.

Per head the state is A ∈ R^{M×D}, B ∈ R^M (METHOD.md §1) plus a per-feature log-scale m ∈ R^M that keeps
both finite (see :class:`~lit_dof.attention.ops.linear.state.LinearAttentionState`). A step costs O(M·D) per head,
independent of how many tokens came before — decoding memory and time are constant in T.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_dof.attention._validation import check_qkv
from lit_dof.attention.ops.linear.chunked import _TINY, _log_normalizer, check_state
from lit_dof.attention.ops.linear.state import LinearAttentionState
from lit_dof.precision import fp32_region


def _step(
    lq: Tensor, lk: Tensor, v: Tensor, state: LinearAttentionState
) -> tuple[Tensor, LinearAttentionState, Tensor]:
    """One token, no checks. lq ``(B, Hk, G, M)``, lk ``(B, Hk, M)``, v ``(B, Hk, D)``, all float32.
    Returns ``(y (B, Hk, G, D), state, log_z (B, Hk, G))``."""
    m_new = torch.maximum(state.log_scale, lk.detach())  # (B, Hk, M)
    decay = torch.exp(state.log_scale - m_new)
    w_k = torch.exp(lk - m_new)  # (B, Hk, M), ≤ 1
    kv = state.kv * decay.unsqueeze(-1) + w_k.unsqueeze(-1) * v.unsqueeze(-2)  # (B, Hk, M, D)
    ks = state.k_sum * decay + w_k
    shifted = lq + m_new.unsqueeze(2)  # (B, Hk, G, M)
    shift = shifted.detach().amax(dim=-1, keepdim=True)  # (B, Hk, G, 1)
    w_q = torch.exp(shifted - shift)  # per-query constant cancels
    num = w_q @ kv  # (B, Hk, G, D)
    den = w_q @ ks.unsqueeze(-1)  # (B, Hk, G, 1)
    return num / den.clamp_min(_TINY), LinearAttentionState(kv, ks, m_new), _log_normalizer(den, shift).squeeze(-1)


@fp32_region()
def recurrent_linear_attention(
    log_phi_q: Tensor,
    log_phi_k: Tensor,
    v: Tensor,
    *,
    initial_state: LinearAttentionState | None = None,
    check_inputs: bool = True,
    return_log_normalizer: bool = False,
) -> tuple[Tensor, LinearAttentionState] | tuple[Tensor, LinearAttentionState, Tensor]:
    """Causal linear attention token by token (decoding; also a second reference for the chunked form).

    Computed in float32 with autocast off, whatever the input dtype and the surrounding autocast.

    Args:
        log_phi_q: ``(B, Hq, T, M)`` log-features of the new queries (T = 1 when decoding).
        log_phi_k: ``(B, Hk, T, M)`` log-features of the new keys, ``Hq % Hk == 0``.
        v: ``(B, Hk, T, D)`` new values.
        initial_state: state after the preceding tokens (e.g. from a chunked prefill), or ``None``.
        check_inputs: reject NaN/+inf inputs.
        return_log_normalizer: also return each row's log-normaliser, as
            :func:`~lit_dof.attention.ops.linear.chunked.chunked_linear_attention` does.

    Returns:
        ``(y, state)``: ``y`` ``(B, Hq, T, D)`` in the dtype of ``v``; the float32 state after the last token.
        The state's size is ``B·Hk·M·(D+2)`` floats whatever the context length. With
        ``return_log_normalizer``, ``(y, state, log_z)``, ``log_z`` ``(B, Hq, T)`` float32.

    Raises:
        ValueError: mismatched shapes, a state of the wrong shape, or NaN input.
    """
    B, Hq, Hk, T, M, D = check_qkv(log_phi_q, log_phi_k, v, finite=check_inputs)
    G = Hq // Hk
    state = initial_state if initial_state is not None else LinearAttentionState.empty(B, Hk, M, D, device=v.device)
    check_state(state, B, Hk, M, D)
    lq = log_phi_q.float().view(B, Hk, G, T, M)
    lk, vf = log_phi_k.float(), v.float()
    outputs, log_zs = [], []
    for t in range(T):
        y, state, log_z = _step(lq[:, :, :, t], lk[:, :, t], vf[:, :, t], state)
        outputs.append(y)  # (B, Hk, G, D)
        log_zs.append(log_z)  # (B, Hk, G)
    y = torch.stack(outputs, dim=3).reshape(B, Hq, T, D)
    if return_log_normalizer:
        return y.to(v.dtype), state, torch.stack(log_zs, dim=3).reshape(B, Hq, T)
    return y.to(v.dtype), state
