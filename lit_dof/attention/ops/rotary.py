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


def rotation_angles(rotary: Rotary) -> Tensor:
    """What a decoding state keeps of ``(cos, sin)`` to undo the rotation later: per position the r/2 angles and
    the common scale (:func:`rotary_from_angles` rebuilds the pair).

    In the rotate-half layout both dims of a pair are turned by one angle (``cos[..., i] = cos[..., i + r/2]``:
    the precondition of :func:`unrotate` too), and every pair carries the same scale s (1, or YaRN's attention
    factor). So r/2 + 1 float32 numbers per position hold what 2r did.

    Args:
        rotary: ``(cos, sin)``, each ``(B or 1, T, r)``, r even.

    Returns:
        ``(B or 1, T, r/2 + 1)`` float32: the angles atan2(sin, cos) of the first half (radians, in (−π, π]), then
        s = (cos² + sin²)^½ of the first pair.

    Raises:
        ValueError: cos/sin of different shapes, or r odd.
    """
    cos, sin = rotary
    if cos.shape != sin.shape or cos.dim() != 3 or cos.shape[-1] % 2:
        shapes = f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
        raise ValueError(f"rotary cos/sin must be (B or 1, T, r) with r even, got {shapes}")
    half = cos.shape[-1] // 2
    c, s = cos[..., :half].float(), sin[..., :half].float()
    return torch.cat([torch.atan2(s, c), torch.hypot(c[..., :1], s[..., :1])], dim=-1)


def rotary_from_angles(packed: Tensor) -> Rotary:
    """The ``(cos, sin)`` pair :func:`rotation_angles` packed, each ``(B or 1, T, r)`` float32 (equal to the
    original up to float32 rounding)."""
    angles, scale = packed[..., :-1], packed[..., -1:]
    cos, sin = torch.cos(angles) * scale, torch.sin(angles) * scale
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
