"""Undoing a teacher's rotary position embedding (RoPE) on queries and keys.

The exact parts of attention need post-RoPE q/k (they reproduce the teacher's logits); a far term whose feature
maps see the vectors *before* the rotation is free of absolute positions (``SlidingWindow.far_rope = False``,
docs/method_students.md "Position-free far term"). transformers applies RoPE in the rotate-half layout:
``x' = x·cos + rotate_half(x)·sin`` on the first r ≤ d dims (partial rotary, e.g. GPT-NeoX, rotates r < d).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.models.llama.modeling_llama import rotate_half

Rotary = tuple[Tensor, Tensor]
"""``(cos, sin)``, each ``(B or 1, T, r)``: the model's rotary embedding of the call's T positions (what
transformers passes an attention module as ``position_embeddings``)."""


def unrotate(x: Tensor, rotary: Rotary) -> Tensor:
    """The pre-RoPE vectors of post-RoPE ``x``: the inverse of transformers' ``apply_rotary_pos_emb``.

    Exact for any rotary embedding whose cos/sin carry a common scale s (YaRN's attention factor: the forward
    map is s·R(θ), so the inverse is R(−θ)/s; ``cos² + sin² = s²``).

    Args:
        x: ``(B, H, T, d)`` post-RoPE queries or keys, d ≥ r.
        rotary: ``(cos, sin)`` of the same T positions, each ``(B or 1, T, r)``, r even.

    Returns:
        ``(B, H, T, d)`` in ``x``'s dtype (computed in float32).

    Raises:
        ValueError: cos/sin whose positions or size do not fit ``x``.
    """
    cos, sin = rotary
    r, T, d = cos.shape[-1], x.shape[-2], x.shape[-1]
    if cos.shape != sin.shape or cos.dim() != 3 or cos.shape[1] != T or r > d or r % 2:
        raise ValueError(
            f"rotary cos/sin must be (B or 1, T={T}, r <= {d}) with r even, got cos {tuple(cos.shape)}, "
            f"sin {tuple(sin.shape)}"
        )
    cos, sin = cos[:, None].float(), sin[:, None].float()  # (B|1, 1, T, r)
    rot = x[..., :r].float()
    back = (rot * cos - rotate_half(rot) * sin) / (cos * cos + sin * sin)
    if r < d:
        back = torch.cat([back, x[..., r:].float()], dim=-1)
    return back.to(x.dtype)
