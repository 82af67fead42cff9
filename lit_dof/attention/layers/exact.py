"""Exact KV heads: the teacher's own causal softmax attention for some KV heads of a linearised layer.

Retrieval in a Transformer is done by a few heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains
Long-Context Factuality", arXiv 2404.15574); DuoAttention (Xiao et al. 2024, arXiv 2410.10819, §3) keeps full
attention in those heads and a window + sinks in the others. In a per-head layer
(:class:`~lit_dof.attention.layers.grouped.HeadGroupedAttention`) a KV head whose feature dimension M is 0 is such
a head: :class:`ExactAttention` attends with full causal softmax over the rotated q/k the attention interface
hands the twin (the teacher's computation for that head), and its decoding state is the head's growing keys and
values (:class:`ExactKVState`) — a KV cache of ``Hk_exact · T · 2d`` elements, like a softmax layer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_dof.attention._validation import check_attention_call
from lit_dof.precision import upcast


@dataclass
class ExactKVState:
    """The keys and values an :class:`ExactAttention` has seen (its KV cache), and which of them are padding.

    Attributes:
        keys: ``(B, Hk, L, d)`` in the model's dtype.
        values: ``(B, Hk, L, D)``.
        valid: ``(B, L)`` bool, False for padding keys.
    """

    keys: Tensor
    values: Tensor
    valid: Tensor

    @property
    def nbytes(self) -> int:
        """Bytes held: keys and values (``Hk·L·(d + D)`` elements) and one bool flag per token, per batch row."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.valid))

    def index_select(self, dim: int, index: Tensor) -> "ExactKVState":
        """Select batch rows (``dim=0``), e.g. for beam-search reordering."""
        return ExactKVState(*(t.index_select(dim, index) for t in (self.keys, self.values, self.valid)))

    def repeat_interleave(self, repeats: int) -> "ExactKVState":
        """Repeat every batch row ``repeats`` times (beam/sample expansion)."""
        return ExactKVState(*(t.repeat_interleave(repeats, dim=0) for t in (self.keys, self.values, self.valid)))


class ExactAttention(nn.Module):
    """Full causal softmax attention of ``num_heads`` query heads over ``num_kv_heads`` KV heads (GQA): the exact
    group of a per-head layer. It has no parameters and nothing to distil.

    Args:
        num_heads: Hq of the group (a multiple of ``num_kv_heads``).
        num_kv_heads: Hk of the group.

    Raises:
        ValueError: ``num_kv_heads`` < 1 or ``num_heads`` not a multiple of it.
    """

    far_term = False
    needs_rotary = False
    far_gated = False
    feature_dim = 0

    def __init__(self, num_heads: int, num_kv_heads: int) -> None:
        super().__init__()
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) >= 1")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads

    def extra_repr(self) -> str:
        """Query and KV heads, for ``print(module)``."""
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, exact softmax"

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: ExactKVState | None = None,
        key_padding_mask: Tensor | None = None,
        *,
        rotary=None,
    ) -> tuple[Tensor, ExactKVState]:
        """Attend causally over the state's keys and the new ones: query i (of T) sits at stream position
        ``L − T + i`` of the L = (state tokens + Tk) keys and sees the valid keys up to it, with logits qᵀk/√d.

        Args:
            q: ``(B, Hq, T, d)`` queries, scaled so that the softmax logits are qᵀk/√d (post-RoPE).
            k: ``(B, Hk, Tk, d)`` keys (post-RoPE), Tk ≥ T (the first Tk − T a prefix without queries).
            v: ``(B, Hk, Tk, D)`` values.
            state: the keys and values of the preceding tokens, or ``None``.
            key_padding_mask: ``(B, Tk)`` bool, False for padding keys.
            rotary: unused (the keys arrive rotated); accepted for the twins' common signature.

        Returns:
            ``(y (B, Hq, T, D) in v's dtype, ExactKVState)``; y is computed in float32 (float64 for float64
            inputs). A query at a padding position attends to itself only.

        Raises:
            ValueError: head counts that do not match the group, Tk < T, or a padding mask that is not
                ``(B, Tk)``.
        """
        Tk = check_attention_call(q, k, v, key_padding_mask, self.num_heads, self.num_kv_heads)
        B, Hq, T, _ = q.shape
        valid = torch.ones(B, Tk, dtype=torch.bool, device=k.device) if key_padding_mask is None else key_padding_mask
        if state is not None:
            k, v = torch.cat([state.keys, k], dim=2), torch.cat([state.values, v], dim=2)
            valid = torch.cat([state.valid, valid.bool()], dim=1)
        L = k.shape[2]
        group = Hq // self.num_kv_heads
        position = torch.arange(L - T, L, device=q.device)[:, None]  # (T, 1): each query's stream index
        key = torch.arange(L, device=q.device)[None, :]
        allowed = ((key <= position)[None] & valid.bool()[:, None, :]) | (key == position)[None]  # (B, T, L)
        compute = upcast(q).dtype
        y = F.scaled_dot_product_attention(
            q.to(compute),
            k.to(compute).repeat_interleave(group, dim=1),
            v.to(compute).repeat_interleave(group, dim=1),
            attn_mask=allowed[:, None],
        )  # scale 1/√d: the scaled queries' logits
        return y.to(v.dtype), ExactKVState(k, v, valid.bool())
