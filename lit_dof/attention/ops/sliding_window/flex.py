"""The exact part of sliding-window attention through PyTorch's ``flex_attention``: window + sinks as a block mask.

The same terms as :func:`~lit_dof.attention.ops.sliding_window.softmax.band_and_sinks_softmax` for a fresh sequence (no
state, the first query at position 0): query p attends key t when ``t ≤ p`` and ``p − t < w`` or ``t < s``, and
not a padding key. ``flex_attention`` (Dong et al. 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels") skips the blocks the mask empties and, compiled, runs one fused kernel on a GPU;
``return_aux`` gives the log-normaliser that merges the window with the linear far term in one normaliser
(:func:`~lit_dof.attention.ops.sliding_window.softmax.merge_normalized`). Grouped-query attention is native
(``enable_gqa``: query head h reads KV head h // G, the grouping of the rest of this package). Uncompiled it runs
PyTorch's reference implementation (every score materialised: tests and the CPU only).
"""

from __future__ import annotations

from functools import cache, lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_dof.attention._validation import check_grouped_qkv, check_positive_int, check_sink_tokens

MIN_COMPILED_HEAD = 16
"""The smallest q/k and value head size Inductor's compiled ``flex_attention`` kernel takes: smaller heads are
zero-padded to it (the logits and outputs unchanged: the scale stays 1/√d)."""


@cache
def _compiled_flex_attention():
    """``torch.compile(flex_attention)``, built once per process on first use (compilation takes seconds)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=16)
def _shared_block_mask(T: int, window: int, sink_tokens: int, device: str):
    """The padding-free mask of these settings, built once and shared by every layer and step that asks for it
    (building one costs a pass over the T × T block grid: on a GPU it would otherwise run in every layer's forward)."""
    return window_block_mask(T, window, sink_tokens, device)


def window_block_mask(
    T: int, window: int, sink_tokens: int, device: torch.device | str, key_padding_mask: Tensor | None = None
):
    """The ``BlockMask`` of causal window + sinks attention over T tokens (``create_block_mask``).

    Args:
        T: tokens (queries = keys).
        window: w ≥ 1, keys ``p − w < t ≤ p`` are attended, the query's own included.
        sink_tokens: s ≥ 0, keys ``t < s`` are attended by every later query.
        device: where the mask is built and used.
        key_padding_mask: ``(B, T)`` bool, False for padding keys; ``None``: no padding (one mask for every row).

    Returns:
        a :class:`torch.nn.attention.flex_attention.BlockMask` for ``flex_attention``.

    Raises:
        ValueError: ``window < 1``, ``sink_tokens < 0`` or a ``key_padding_mask`` not of shape ``(B, T)``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    check_positive_int("window", window)
    check_sink_tokens(sink_tokens)

    def window_and_sinks(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((q_idx - kv_idx < window) | (kv_idx < sink_tokens))

    if key_padding_mask is None:
        return create_block_mask(window_and_sinks, None, None, T, T, device=device)
    if key_padding_mask.dim() != 2 or key_padding_mask.shape[1] != T:
        raise ValueError(f"key_padding_mask must have shape (B, T={T}), got {tuple(key_padding_mask.shape)}")
    valid = key_padding_mask.to(device=device, dtype=torch.bool)

    def padded(b, h, q_idx, kv_idx):
        return window_and_sinks(b, h, q_idx, kv_idx) & valid[b, kv_idx]

    return create_block_mask(padded, valid.shape[0], None, T, T, device=device)


def flex_window_softmax(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    sink_tokens: int = 0,
    key_padding_mask: Tensor | None = None,
    block_mask=None,
    compiled: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Normalised softmax over each query's window and the sinks, with its log-normaliser.

    Args:
        q: ``(B, Hq, T, d)`` queries (logits are qᵀk/√d), positions 0 … T − 1.
        k: ``(B, Hk, T, d)`` keys, ``Hq % Hk == 0``.
        v: ``(B, Hk, T, D)`` values.
        window: w ≥ 1.
        sink_tokens: s ≥ 0.
        key_padding_mask: ``(B, T)`` bool, False for padding keys (a row that sees none gives ``o = 0``,
            ``log_z = -inf``).
        block_mask: a mask from :func:`window_block_mask` for these settings; ``None``: without padding, the one
            mask of (T, w, s, device) shared by every call (built once per process and kept among the 16 most
            recent); with padding, one built for this batch.
        compiled: run the compiled kernel (``None``: on CUDA only; the uncompiled one holds T × T scores); head
            sizes below :data:`MIN_COMPILED_HEAD` are zero-padded to it for that kernel.

    Returns:
        ``(o (B, Hq, T, D), log_z (B, Hq, T))`` in float32 (float64 for float64 inputs) — what
        :func:`~lit_dof.attention.ops.sliding_window.softmax.band_and_sinks_softmax` returns for a fresh sequence,
        with the query heads unflattened.

    Raises:
        ValueError: inconsistent shapes or settings.
    """
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    _, Hq, Hk, T, _ = check_grouped_qkv(q, k, v)
    if key_padding_mask is not None and bool(key_padding_mask.all()):
        key_padding_mask = None  # a batch without padding: the shared mask
    if block_mask is None and key_padding_mask is None:  # window_block_mask checks the settings (errors: no entry)
        block_mask = _shared_block_mask(T, window, sink_tokens, str(q.device))
    elif block_mask is None:
        block_mask = window_block_mask(T, window, sink_tokens, q.device, key_padding_mask)
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    compiled = q.is_cuda if compiled is None else compiled
    d, D = q.shape[-1], v.shape[-1]
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if compiled:  # zero columns add nothing to qᵀk and give zero output columns, cut below
        q, k = (F.pad(x, (0, max(0, MIN_COMPILED_HEAD - d))) for x in (q, k))
        v = F.pad(v, (0, max(0, MIN_COMPILED_HEAD - D)))
    run = _compiled_flex_attention() if compiled else flex_attention
    o, aux = run(q, k, v, block_mask=block_mask, scale=d**-0.5, enable_gqa=Hq != Hk, return_aux=AuxRequest(lse=True))
    return o[..., :D], aux.lse
