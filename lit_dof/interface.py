"""lit-dof's single extension point into transformers: an attention function registered as ``"lit_dof"``.

A teacher keeps its own modeling code — projections, RoPE (full or partial), GQA layout, q/k norms — and
calls ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, q, k, v, mask, scaling=…)`` with the
post-RoPE queries and keys. Setting the implementation to ``"lit_dof"`` routes every attention layer
through :func:`lit_dof_attention`, which per module

* records q/k/v (and the output) when a capture recorder is attached (teacher capture, DoF);
* runs causal *linear* attention when an :class:`AttentionSlot` with a linear module is attached and not
  switched to softmax (students, hybrids);
* otherwise runs transformers' own SDPA attention unchanged (teacher layers, softmax layers of hybrids).

The matching mask function is registered under the same name (transformers' ``sdpa_mask``): without it
``create_causal_mask`` returns ``None`` for an unknown implementation and the padding mask is silently
dropped. Linear layers read key padding from that mask (see :func:`key_padding_from_mask`).

Registering both functions at import is idempotent; it is how transformers' extension point works.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import transformers
from packaging.version import Version
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "lit_dof"
"""The ``attn_implementation`` name under which lit-dof's attention and mask functions are registered."""

CACHE_KWARG = "lit_dof_cache"
"""Keyword under which the forward pre-hook hands the layer's ``Cache`` to :func:`lit_dof_attention`."""

ROTARY_KWARG = "lit_dof_rotary"
"""Keyword under which the forward pre-hook hands the module's rotary ``(cos, sin)`` (its ``position_embeddings``)
to :func:`lit_dof_attention`; ``None`` for a model without rotary positions."""

MODEL_CACHE_ARGUMENT = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"
"""The name under which a transformers model's ``forward`` takes, ``generate`` keeps and a model output returns
the ``Cache``: ``cache`` since transformers 5.24 (``past_key_values`` is deprecated there, with a FutureWarning
on every call that names it), ``past_key_values`` before."""

Recorder = Callable[[nn.Module, Tensor, Tensor, Tensor, "Tensor | None", Tensor, "tuple[Tensor, Tensor] | None"], None]
"""``(module, q (B,Hq,T,d) scaled, k (B,Hk,Tk,d), v (B,Hk,Tk,D), key_padding (B,Tk) | None, out (B,T,Hq,D),
rotary (cos, sin) (B|1,T,r) | None)``."""


class AttentionSlot(nn.Module):
    """What lit-dof attaches to a teacher attention module (as its submodule ``lit_dof``).

    Args:
        linear: the linear-attention module, called as ``linear(q, k, v, state, key_padding_mask, rotary=rotary)
            -> (y, state)`` with ``rotary`` the module's ``(cos, sin)`` or ``None`` (e.g.
            :class:`~lit_dof.attention.CausalLinearAttention`); ``None`` for none.
        use_softmax: run the teacher's softmax attention instead (a hybrid's softmax layer; switchable).
    """

    def __init__(self, linear: nn.Module | None = None, *, use_softmax: bool = False) -> None:
        super().__init__()
        self.linear = linear
        self.use_softmax = use_softmax
        self.recorder: Recorder | None = None

    @property
    def is_linear(self) -> bool:
        """True when this layer currently runs linear attention."""
        return self.linear is not None and not self.use_softmax

    def extra_repr(self) -> str:
        """Whether the layer currently runs the teacher's softmax attention, for ``print(module)``."""
        return f"use_softmax={self.use_softmax}"


def effective_query(query: Tensor, scaling: float | None) -> Tensor:
    """Rescale queries so that the model's logits ``scaling·qᵀk`` read ``q'ᵀk/√d`` (METHOD.md §1's kernel).

    Llama, Qwen2 and GPT-NeoX use ``scaling = d^-½`` (no change); GPT-2 with ``scale_attn_by_inverse_layer_idx``
    or Gemma-3's ``query_pre_attn_scalar`` do not. ``query``: ``(B, H, T, d)``.
    """
    if scaling is None:
        return query
    factor = scaling * math.sqrt(query.shape[-1])
    return query if abs(factor - 1.0) < 1e-7 else query * factor


def key_padding_from_mask(attention_mask: Tensor | None, key_length: int) -> Tensor | None:
    """``(B, Tk)`` bool key validity (False = padding) from a 4-D SDPA/eager mask, or ``None`` if none is masked.

    transformers builds ``mask[b, 0, i, j] = causal(i, j) ∧ valid[b, j]``; the last query row sees every key,
    so its last ``key_length`` columns are the key validity. (Masks that are not of that form — packed
    sequences, sliding windows — are not supported by linear layers; sliding layers stay softmax.)
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 4:
        raise ValueError(f"expected a 4-D attention mask (B, 1, Tq, Tkv), got shape {tuple(attention_mask.shape)}")
    row = attention_mask[:, 0, -1, -key_length:]
    valid = row if row.dtype == torch.bool else row > torch.finfo(row.dtype).min / 2
    return None if bool(valid.all()) else valid


def find_cache(args: tuple, kwargs: dict) -> Cache | None:
    """The ``Cache`` passed to an attention module's forward (``cache=``, ``past_key_values=``, ``layer_past=`` or
    positional)."""
    for value in (*kwargs.values(), *args):
        if isinstance(value, Cache):
            return value
    return None


def find_rotary(kwargs: dict) -> tuple[Tensor, Tensor] | None:
    """The rotary ``(cos, sin)`` passed to an attention module's forward as ``position_embeddings`` (Llama, Qwen2,
    Mistral, GPT-NeoX, Gemma-3), or ``None``."""
    rotary = kwargs.get("position_embeddings")
    if isinstance(rotary, (tuple, list)) and len(rotary) == 2 and all(isinstance(t, Tensor) for t in rotary):
        return tuple(rotary)
    return None


def _inject_forward_kwargs(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: pass the module's cache and rotary embedding on to :func:`lit_dof_attention` (the module
    consumes both otherwise)."""
    kwargs[CACHE_KWARG] = find_cache(args, kwargs)
    kwargs[ROTARY_KWARG] = find_rotary(kwargs)
    return args, kwargs


def install_attention_hook(module: nn.Module) -> None:
    """Register, once and for good, the pre-hook that forwards the cache and rotary embedding of a teacher attention
    module to :func:`lit_dof_attention` (students; a capture adds it for its duration with :func:`attention_hook`)."""
    if not getattr(module, "_lit_dof_hooked", False):
        module.register_forward_pre_hook(_inject_forward_kwargs, with_kwargs=True)
        module._lit_dof_hooked = True


def attention_hook(module: nn.Module):
    """The same pre-hook for a while: returns its removable handle, or ``None`` when the module has it for good."""
    if getattr(module, "_lit_dof_hooked", False):
        return None
    return module.register_forward_pre_hook(_inject_forward_kwargs, with_kwargs=True)


def lit_dof_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The registered ``"lit_dof"`` attention function (signature of transformers' attention interface).

    Args:
        module: the teacher's attention module (``layer_idx``, optional ``lit_dof`` slot).
        query: ``(B, Hq, T, d)`` post-RoPE queries.
        key: ``(B, Hk, Tk, d)`` post-RoPE keys.
        value: ``(B, Hk, Tk, D)`` values.
        attention_mask: the 4-D mask from the registered mask function, or ``None``.
        scaling: the softmax scale the model uses.
        dropout: attention dropout of the softmax path.
        **kwargs: the interface's other keywords: the student's cache and rotary embedding (from the pre-hook) are
            taken from them, the rest go to the softmax path.

    Returns:
        ``(out (B, T, Hq, D), weights or None)`` like every attention-interface function.
    """
    cache = kwargs.pop(CACHE_KWARG, None)
    rotary = kwargs.pop(ROTARY_KWARG, None)
    slot = getattr(module, "lit_dof", None)
    slot = slot if isinstance(slot, AttentionSlot) else None
    linear = slot is not None and slot.is_linear
    recorder = slot.recorder if slot is not None else None
    if linear or recorder is not None:  # both see the kernel's view: scaled q, key padding
        q = effective_query(query, scaling)
        padding = key_padding_from_mask(attention_mask, key.shape[2])
    if linear:
        layer = _state_layer(cache, module.layer_idx)
        state = layer.state if layer is not None else None
        y, state = slot.linear(q, key, value, state, padding, rotary=rotary)
        if layer is not None:
            layer.state = state
        out, weights = y.transpose(1, 2).contiguous(), None
    else:
        out, weights = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if recorder is not None:
        recorder(module, q, key, value, padding, out, rotary)
    return out, weights


def _state_layer(cache: Cache | None, layer_idx: int):
    """The layer's recurrent-state cache layer (:class:`lit_dof.students.cache.RecurrentStateLayer`), if any.

    Any other cache layer (e.g. a plain ``DynamicLayer``) returns the full key history; the linear module
    then folds the prefix into a state on the fly (exact, O(T) per step).
    """
    if cache is None or layer_idx >= len(cache.layers):
        return None
    layer = cache.layers[layer_idx]
    return layer if getattr(layer, "holds_linear_attention_state", False) else None


AttentionInterface.register(ATTN_IMPLEMENTATION, lit_dof_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
