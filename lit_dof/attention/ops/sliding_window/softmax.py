"""The exact part of sliding-window attention: masked softmax over the window (banded, in chunks of queries, or
for one decoded token) and over the attention sinks, each normalised with its log-normaliser, and the merge of
normalised parts into one normaliser (the combination rule of :mod:`lit_dof.attention.ops.sliding_window.chunked`).

Notation as there: B batch, Hk key/value heads, G query heads per key head, T queries, d head size, D value
size, w window, s sinks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

_TINY = torch.finfo(torch.float32).tiny


def masked_softmax_part(logits: Tensor, mask: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Normalised softmax output and log-normaliser of one group of attention terms.

    Args:
        logits: ``(..., R, L)`` attention logits.
        mask: broadcastable to ``logits``, True where a term counts.
        values: ``(..., L, D)``.

    Returns:
        ``(o (..., R, D), log_z (..., R))``: ``o = Σ softmax·v`` over the kept terms, ``log_z = logsumexp``;
        a row with no kept term gives ``o = 0``, ``log_z = -inf`` and zero gradients (never NaN).
    """
    logits = logits.masked_fill(~mask, float("-inf"))
    top = logits.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = (logits - top).exp()  # every entry ≤ 1; masked ones 0
    total = weights.sum(dim=-1, keepdim=True)
    out = (weights @ values) / total.clamp_min(_TINY)
    return out, _safe_log(total).squeeze(-1) + top.squeeze(-1)


def merge_normalized(o1: Tensor, log_z1: Tensor, o2: Tensor, log_z2: Tensor) -> tuple[Tensor, Tensor]:
    """Merge two normalised attention parts into one normaliser.

    ``o = (e^{z1} o1 + e^{z2} o2) / (e^{z1} + e^{z2})``, ``z = log(e^{z1} + e^{z2})``, computed relative to
    ``max(z1, z2)`` (no overflow); rows where both are ``-inf`` give ``o = 0``, ``z = -inf``.

    Args:
        o1: ``(..., R, D)`` output of the first part.
        log_z1: ``(..., R)`` its log-normaliser.
        o2: ``(..., R, D)`` output of the second part.
        log_z2: ``(..., R)`` its log-normaliser.

    Returns:
        ``(o (..., R, D), log_z (..., R))``.
    """
    top = torch.maximum(log_z1, log_z2).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    a1, a2 = (log_z1 - top).exp(), (log_z2 - top).exp()
    total = a1 + a2
    out = (a1.unsqueeze(-1) * o1 + a2.unsqueeze(-1) * o2) / total.clamp_min(_TINY).unsqueeze(-1)
    return out, _safe_log(total) + top


def _safe_log(x: Tensor) -> Tensor:
    """``log x`` with ``-inf`` and a zero gradient where ``x == 0``."""
    return torch.where(x > 0, x.clamp_min(_TINY).log(), float("-inf"))


def band_softmax(
    q: Tensor, keys: Tensor, values: Tensor, valid: Tensor, offset: int, window: int, chunk: int
) -> tuple[Tensor, Tensor]:
    """Exact softmax of T queries over the w keys ending at each query, in chunks of queries.

    Temporaries are ``O(T·(chunk + w))``, not ``O(T²)``: chunk n of C queries sees the C + w − 1 stream keys
    its band can reach, gathered by ``unfold`` (no copy).

    Args:
        q: ``(B, Hk, G, T, d)`` queries in the compute dtype (logits are qᵀk/√d).
        keys: ``(B, Hk, b + T, d)`` the key stream: b buffered keys, then the T new ones.
        values: ``(B, Hk, b + T, D)``.
        valid: ``(B, b + T)`` bool, False for padding keys.
        offset: b, the stream index of the first query (query i sits at stream index ``offset + i``).
        window: w ≥ 1; query i sees stream keys ``offset + i − w < j ≤ offset + i``.
        chunk: queries per chunk.

    Returns:
        ``(o (B, Hk, G, T, D), log_z (B, Hk, G, T))`` as :func:`masked_softmax_part` returns them.
    """
    B, Hk, G, T, d = q.shape
    D = values.shape[-1]
    C = min(T, chunk)
    N = math.ceil(T / C)
    L = C + window - 1  # the keys any query of a chunk may see
    back = N * C - T
    # Stream padded by w invalid keys in front: query i of chunk n sees padded keys [b+1+nC, b+nC+C+w).
    kp = F.pad(keys, (0, 0, window, back))[:, :, offset + 1 :]
    vp = F.pad(values, (0, 0, window, back))[:, :, offset + 1 :]
    ok = F.pad(valid, (window, back), value=False)[:, offset + 1 :].unfold(1, L, C)  # (B, N, L)
    kb = kp.unfold(2, L, C)  # (B, Hk, N, d, L)
    vb = vp.unfold(2, L, C).transpose(-1, -2)  # (B, Hk, N, L, D)
    qc = F.pad(q, (0, 0, 0, back)).view(B, Hk, G, N, C, d).transpose(2, 3).reshape(B, Hk, N, G * C, d)
    logits = (qc @ kb) / math.sqrt(d)  # (B, Hk, N, G·C, L)
    i = torch.arange(C, device=q.device)[:, None]
    j = torch.arange(L, device=q.device)[None, :]
    band = (j >= i) & (j <= i + window - 1)  # (C, L): key j of the chunk's window is within w of query i
    mask = band.repeat(G, 1)[None, None, None] & ok[:, None, :, None, :]  # (B, 1, N, G·C, L)
    o, log_z = masked_softmax_part(logits, mask, vb)  # (B, Hk, N, G·C, D), (B, Hk, N, G·C)
    o = o.view(B, Hk, N, G, C, D).transpose(2, 3).reshape(B, Hk, G, N * C, D)[:, :, :, :T]
    log_z = log_z.view(B, Hk, N, G, C).transpose(2, 3).reshape(B, Hk, G, N * C)[:, :, :, :T]
    return o, log_z


def decode_window_softmax(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    valid: Tensor,
    sink_k: Tensor,
    sink_v: Tensor,
    sink_ok: Tensor,
    position: int,
    window: int,
) -> tuple[Tensor, Tensor]:
    """Exact softmax of one query at ``position`` over its window and the sinks that have left it.

    The decoding case (T = 1) of :func:`band_softmax` followed by the sink part and their merge, as one masked
    softmax over the concatenated keys: the same terms, one normaliser, fewer and larger operations per token.

    Args:
        q: ``(B, Hk, G, 1, d)`` the query in the compute dtype (logits are qᵀk/√d).
        keys: ``(B, Hk, b + 1, d)`` the key stream, the query's own key last (b ≤ w buffered keys before it).
        values: ``(B, Hk, b + 1, D)``.
        valid: ``(B, b + 1)`` bool, False for padding keys.
        sink_k: ``(B, Hk, s', d)`` the sink keys, positions 0 … s' − 1.
        sink_v: ``(B, Hk, s', D)`` their values.
        sink_ok: ``(B, s')`` bool, False for padding sinks.
        position: p, the query's absolute position; sinks at positions ≤ p − w have left the window.
        window: w ≥ 1.

    Returns:
        ``(o (B, Hk, G, 1, D), log_z (B, Hk, G, 1))`` as :func:`masked_softmax_part` returns them.
    """
    keys, values, valid = keys[:, :, -window:], values[:, :, -window:], valid[:, -window:]
    outside = max(0, min(sink_k.shape[2], position - window + 1))  # sinks at positions ≤ p − w left the window
    if outside:
        keys = torch.cat([sink_k[:, :, :outside].to(keys.dtype), keys], 2)
        values = torch.cat([sink_v[:, :, :outside].to(values.dtype), values], 2)
        valid = torch.cat([sink_ok[:, :outside], valid], 1)
    logits = (q @ keys.transpose(-1, -2)[:, :, None]) / math.sqrt(q.shape[-1])  # (B, Hk, G, 1, L)
    return masked_softmax_part(logits, valid[:, None, None, None, :], values[:, :, None])


def band_and_sinks_softmax(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    valid: Tensor,
    sink_k: Tensor,
    sink_v: Tensor,
    sink_ok: Tensor,
    position: int,
    offset: int,
    window: int,
    chunk: int,
) -> tuple[Tensor, Tensor]:
    """Exact softmax of T queries over their windows (:func:`band_softmax`) merged with the sinks that have left
    each query's window (:func:`merge_normalized`); the prefill and training counterpart of
    :func:`decode_window_softmax`.

    Args:
        q: ``(B, Hk, G, T, d)`` queries in the compute dtype.
        keys: ``(B, Hk, b + T, d)`` the key stream, as :func:`band_softmax`.
        values: ``(B, Hk, b + T, D)``.
        valid: ``(B, b + T)`` bool, False for padding keys.
        sink_k: ``(B, Hk, s', d)`` the sink keys, positions 0 … s' − 1.
        sink_v: ``(B, Hk, s', D)`` their values.
        sink_ok: ``(B, s')`` bool, False for padding sinks.
        position: the absolute position of the first query.
        offset: b, the stream index of the first query.
        window: w ≥ 1.
        chunk: queries per chunk of the band.

    Returns:
        ``(o (B, Hk, G, T, D), log_z (B, Hk, G, T))``.
    """
    o, log_z = band_softmax(q, keys, values, valid, offset, window, chunk)
    if not sink_k.shape[2]:
        return o, log_z
    positions = position + torch.arange(q.shape[3], device=q.device)
    outside = torch.arange(sink_k.shape[2], device=q.device)[None, :] <= positions[:, None] - window  # (T, s')
    logits = (q @ sink_k.to(q.dtype).transpose(-1, -2)[:, :, None]) / math.sqrt(q.shape[-1])  # (B, Hk, G, T, s')
    mask = outside[None, None, None] & sink_ok[:, None, None, None, :]
    o_s, log_z_s = masked_softmax_part(logits, mask, sink_v.to(q.dtype)[:, :, None])
    return merge_normalized(o, log_z, o_s, log_z_s)
