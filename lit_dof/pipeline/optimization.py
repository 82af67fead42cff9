"""The layer-wise phase's optimizer settings: its parameter groups (one learning rate per kind of feature-map
parameter, LoRA apart) and its learning-rate schedule — linear warm-up, cosine decay to a floor, and the
end-to-end tail's own cosine from a lower start (paper §3 for the layer-wise phase; Hedgehog §4, LoLCATs §3 for
the tail).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from torch import nn

from lit_dof.attention.feature_maps.base import PARAM_GROUPS, FeatureMap


def parameter_groups(
    student: nn.Module, trainable: Iterable[tuple[str, nn.Parameter]], lrs: dict[str, float]
) -> list[dict]:
    """The optimizer's parameter groups: each feature map's parameters in the group its
    :meth:`~lit_dof.attention.FeatureMap.param_groups` names (``z``, ``log_alpha``, ``other``), LoRA adapters
    (peft's ``lora_`` parameters) in ``lora``, any other trainable parameter (a sliding window's far-term weight β)
    in ``other``.

    Args:
        student: the model holding the feature maps.
        trainable: ``(name, parameter)`` pairs to train.
        lrs: the learning rate of each group, ``{"z", "log_alpha", "other", "lora"}``.

    Returns:
        ``[{"params", "lr", "name"}]`` for the non-empty groups.

    Raises:
        ValueError: a feature map names a group outside :data:`~lit_dof.attention.feature_maps.base.PARAM_GROUPS`.
    """
    group_of = {}  # id(parameter) -> group, as each feature map declares it
    for module in student.modules():
        if isinstance(module, FeatureMap):
            for group, members in module.param_groups().items():
                if group not in PARAM_GROUPS:
                    name = type(module).__name__
                    raise ValueError(f"{name}.param_groups() names group {group!r}; use one of {PARAM_GROUPS}")
                group_of.update((id(p), group) for p in members)
    groups: dict[str, list] = {"z": [], "log_alpha": [], "other": [], "lora": []}
    for name, parameter in trainable:
        groups["lora" if ".lora_" in name else group_of.get(id(parameter), "other")].append(parameter)
    return [{"params": p, "lr": lrs[g], "name": g} for g, p in groups.items() if p]


def phase_schedule(total: int, switch: int, warmup: int, floor: float, tail_ratio: float) -> Callable[[int], float]:
    """The multiplier of every base learning rate at optimizer step ``step`` (a ``LambdaLR`` ``lr_lambda``).

    Steps ``[0, warmup)`` ramp linearly to 1 (``(step + 1) / warmup``); steps ``[warmup, switch)`` follow a cosine
    from 1 down to ``floor``; the tail ``[switch, total)`` follows its own cosine from ``tail_ratio`` down to
    ``tail_ratio · floor``.

    Args:
        total: optimizer steps of the run.
        switch: first step of the end-to-end tail (``total``: no tail).
        warmup: warm-up steps (0: none).
        floor: the cosine's floor, a fraction of each learning rate (``min_lr_ratio``).
        tail_ratio: the tail's starting fraction (``finetune_lr_ratio``).

    Returns:
        ``step -> multiplier``.
    """

    def cosine(progress: float) -> float:
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def schedule(step: int) -> float:
        if step >= switch:  # end-to-end tail: its own cosine, from `tail_ratio` down to tail_ratio · floor
            return tail_ratio * cosine((step - switch) / max(1, total - switch))
        if step < warmup:
            return (step + 1) / warmup
        return cosine((step - warmup) / max(1, switch - warmup))

    return schedule
