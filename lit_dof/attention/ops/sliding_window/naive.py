"""Quadratic float64 reference for sliding-window + linear attention — the ground truth the kernels of
:mod:`lit_dof.attention.ops.sliding_window` are tested against: one softmax over exact pairs (the window and the
sink tokens) and linear pairs (everything older, scored by the kernel estimate K̂ of
:mod:`lit_dof.attention.ops.linear.naive`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_dof.attention.ops.delta_rule.naive import naive_delta_rule
from lit_dof.attention.ops.linear.naive import log_kernel_matrix


def sliding_window_masks(T: int, window: int, sink_tokens: int = 0, *, device=None) -> tuple[Tensor, Tensor]:
    """Which (query, key) pairs of a causal sequence are exact and which are linear in sliding-window + linear
    attention (:mod:`lit_dof.attention.ops.sliding_window.chunked`).

    Args:
        T: tokens.
        window: w ≥ 1, tokens attended exactly (the query's own included).
        sink_tokens: s ≥ 0, the first tokens always attended exactly.
        device: where the masks are made (``None``: torch's default device).

    Returns:
        ``(exact, linear)`` bool ``(T, T)`` over (query i, key j): exact where ``j ≤ i`` and (``i − w < j`` or
        ``j < s``), linear where ``s ≤ j ≤ i − w``; disjoint, together the causal triangle.
    """
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    causal = j <= i
    exact = causal & ((j > i - window) | (j < sink_tokens))
    return exact, causal & ~exact


def naive_sliding_window_attention(
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
    far_cached: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    return_log_z: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Reference (quadratic, float64) sliding-window + linear attention: one softmax over the logits
    ``qᵀk/√d`` on exact pairs and ``β_h − λ_h (i − w − j) + Σ_{j+w<t≤i} g_ht + log K̂(q_i, k_j)`` on linear pairs
    (:func:`sliding_window_masks`).

    Args:
        q: ``(B, Hq, T, d)`` scaled queries.
        k: ``(B, Hk, T, d)`` keys.
        v: ``(B, Hk, T, D)`` values.
        log_phi_q: exact query log-features ``(B, Hq, T, M)``, or ``None`` (no linear term).
        log_phi_k: exact key log-features ``(B, Hk, T, M)``, or ``None`` together with ``log_phi_q``.
        window: w, tokens attended exactly.
        sink_tokens: s, first tokens attended exactly.
        log_mix: ``(Hq,)`` β, log-weight of the linear terms (``None``: 0).
        far_decay: ``(Hk,)`` λ, decay rate of the linear terms per key head, or ``(Hk, M)``, one per feature: far
            pair (i, j) then scores ``β_h + log Σ_f φ_f(q_i) φ_f(k_j) e^{−λ_hf (i − w − j)}`` (``None``: 0).
        far_log_gates: ``(B, Hk, T)`` g ≤ 0, the log forget gate of the far terms at each token (``None``: 0).
        far_write: ``(B, Hk, T)`` β of each token's key: the far part's value is then the readout of the
            delta-rule memory of the far keys (:func:`~lit_dof.attention.ops.delta_rule.naive.naive_delta_rule`
            over unit features, key t written when query t + w arrives), its weight the far logits' mass.
        far_cached: ``(B, Hk, T, T)`` bool, far pairs kept exactly (the exact far cache,
            :func:`~lit_dof.attention.ops.sliding_window.far_cache.cached_far_pairs`): scored by ``qᵀk/√d`` in the
            one softmax and left out of the far sum (``None``: none). Not with ``far_write``.
        key_padding_mask: ``(B, T)`` bool, False for padding keys.
        return_log_z: also return the log of the softmax normaliser, ``(B, Hq, T)`` float64 (additive far term only).

    Returns:
        ``(B, Hq, T, D)`` in v's dtype (rows without any allowed key are NaN); with ``return_log_z``, ``(y, log_z)``.

    Raises:
        ValueError: ``far_cached`` or ``return_log_z`` with ``far_write``.
    """
    B, Hq, T, d = q.shape
    group = Hq // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    logits = q.double() @ kk.transpose(-1, -2) / d**0.5  # (B, Hq, T, T)
    exact, linear = sliding_window_masks(T, window, sink_tokens, device=q.device)
    if far_cached is not None:
        if far_write is not None:
            raise ValueError("an exact far cache goes with the additive far term, not the delta-rule memory")
        cached = far_cached.bool().repeat_interleave(group, dim=1) & linear
        exact, linear = exact | cached, linear & ~cached  # (B, Hq, T, T) each
    far = torch.full_like(logits, float("-inf"))
    if log_phi_q is not None:
        lq, lk = log_phi_q.double(), log_phi_k.double().repeat_interleave(group, dim=1)
        if far_decay is not None and far_decay.dim() == 2:  # per feature: inside the sum over features
            beyond = (torch.arange(T, device=q.device)[:, None] - window - torch.arange(T, device=q.device)).double()
            rates = far_decay.double().repeat_interleave(group, dim=0)  # (Hq, M)
            far = torch.logsumexp(
                lq[:, :, :, None] + lk[:, :, None] - rates[None, :, None, None, :] * beyond[..., None], dim=-1
            )
        else:
            far = log_kernel_matrix(lq, lk)
        if log_mix is not None:
            far = far + log_mix.double()[None, :, None, None]
        if far_decay is not None and far_decay.dim() == 1:
            beyond = (torch.arange(T, device=q.device)[:, None] - window - torch.arange(T, device=q.device)).double()
            far = far - far_decay.double().repeat_interleave(group)[:, None, None] * beyond
        if far_log_gates is not None:  # Σ_{j+w<t≤i} g_t = c_i − c_{j+w}, c the inclusive cumulative sum
            c = far_log_gates.double().repeat_interleave(group, dim=1).cumsum(-1)  # (B, Hq, T)
            left = c[:, :, (torch.arange(T, device=q.device) + window).clamp_max(T - 1)]  # c_{j+w} (unused past T)
            far = far + c[:, :, :, None] - left[:, :, None, :]
        far = far.masked_fill(~linear, float("-inf"))
    logits = torch.where(exact, logits, far)
    if key_padding_mask is not None:
        logits = logits.masked_fill(~key_padding_mask.bool()[:, None, None, :], float("-inf"))
    if far_write is None:
        y = (torch.softmax(logits, dim=-1) @ vv).to(v.dtype)
        return (y, torch.logsumexp(logits, dim=-1)) if return_log_z else y
    if return_log_z:
        raise ValueError("return_log_z is the additive far term's: the delta-rule readout has no single normaliser")
    top = logits.amax(-1, keepdim=True)
    weights = (logits - top).exp()
    exact_w, far_mass = weights * exact, (weights * ~exact).sum(-1, keepdim=True)
    gates = far_log_gates
    if far_decay is not None:  # the decay is the constant gate −λ
        gates = (0 if gates is None else gates) - far_decay.double()[None, :, None].expand(B, k.shape[1], T)
    readout = _delta_readout(log_phi_q, log_phi_k, v, far_write, gates, window, sink_tokens, key_padding_mask)
    return ((exact_w @ vv + far_mass * readout) / (exact_w.sum(-1, keepdim=True) + far_mass)).to(v.dtype)


def _delta_readout(lq, lk, v, write, gates, window, sinks, key_padding_mask) -> Tensor:
    """``(B, Hq, T, D)``: at query p, the delta-rule memory of the far keys t ≤ p − w (t ≥ s, not padding), key t
    written at index t + w under the gates of the indices, read with the unit query features."""
    B, Hk, T, _ = lk.shape

    def unit(x: Tensor) -> Tensor:
        return torch.nn.functional.normalize((x - x.amax(-1, keepdim=True)).exp(), dim=-1)

    usable = torch.arange(T, device=lk.device) >= sinks  # (T,)
    usable = usable[None, :] if key_padding_mask is None else usable[None, :] & key_padding_mask.bool()  # (B, T)
    keys = unit(lk.double()) * usable[:, None, :, None]
    shift = (0, 0, window, 0)  # key t enters at index t + w
    keys = torch.nn.functional.pad(keys, shift)[:, :, :T]
    values = torch.nn.functional.pad(v.double(), shift)[:, :, :T]
    beta = torch.nn.functional.pad(write.double() * usable[:, None, :], (window, 0))[:, :, :T]
    return naive_delta_rule(unit(lq.double()), keys, values, beta, gates)[0]
