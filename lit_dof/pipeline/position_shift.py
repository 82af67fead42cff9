"""Training at shifted absolute positions (``position_shift``): each sequence's position ids start at a random
offset, drawn per row and seeded by the step, so that a resumed run draws the same offsets.

Rotary position encodings make the teacher's attention depend on relative positions only, so its outputs do not
change, while the feature maps — which see post-RoPE q/k, whose absolute rotation they are not invariant to — learn
the rotations of positions up to S + ``seq_len`` rather than only of the first ``seq_len`` (it does not show them
query–key distances beyond ``seq_len``). Supported; not used by the shipped recipes (all keep 0; tried and not
adopted: docs/results/sliding_window/README.md, "Absolute positions"; docs/method_students.md). With
``sliding_window.far_rope: false`` the feature maps see q/k with RoPE undone, so the shift changes nothing they see.
"""

from __future__ import annotations

import torch


def shifted_position_ids(batch: dict, shift: int, seed: int, generator: torch.Generator) -> torch.Tensor:
    """``(B, T)`` position ids of a training batch: each row's positions (counted over its attended tokens when the
    batch has an ``attention_mask``) plus an offset drawn uniformly from [0, shift].

    Args:
        batch: ``{"input_ids": (B, T), "attention_mask": (B, T) optional}``.
        shift: S ≥ 1, the largest offset (tokens).
        seed: the draw's seed (the caller's step and micro-batch).
        generator: a CPU generator, re-seeded here.

    Returns:
        ``(B, T)`` long tensor on the batch's device.
    """
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    generator.manual_seed(seed)
    offsets = torch.randint(0, shift + 1, (ids.shape[0], 1), generator=generator)
    base = (mask.long().cumsum(-1) - 1).clamp(min=0) if mask is not None else torch.arange(ids.shape[1]).expand_as(ids)
    return base.to(ids.device) + offsets.to(ids.device)
