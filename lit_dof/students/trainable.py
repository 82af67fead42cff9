"""Which parameters of a teacher or student a training phase updates: one selection (:data:`Trainable`) shared by
the distillation phases (:mod:`lit_dof.pipeline`) and the task fine-tuning protocol
(:mod:`lit_dof.evaluation.finetune`), chosen by module identity, not by parameter names; and the type of the
optimizer those phases are given (:data:`OptimizerCallable`)."""

from __future__ import annotations

from typing import Callable, Iterable, Literal

import torch
from torch import nn

from lit_dof.teacher.families import attention_layers

Trainable = Literal["all", "attention", "feature_maps"]
"""``"all"``: every parameter; ``"attention"``: the attention blocks (q/k/v/o projections, and in a student the
linear twins inside them) of the layers that run linear attention — of every layer in a model without twins;
``"feature_maps"``: the linear twins' own parameters (feature maps φ, far-term weights β)."""

OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]
"""``params -> Optimizer`` (Lightning's ``OptimizerCallable``), given to a phase that builds its optimizer from its
own parameter groups; in YAML a ``class_path`` (``torch.optim.AdamW``) with ``init_args``."""

TRAINABLE = ("all", "attention", "feature_maps")
"""The values of :data:`Trainable`."""


def check_trainable(which: str) -> str:
    """``which`` if it is a :data:`Trainable` value.

    Args:
        which: the selection.

    Returns:
        ``which``.

    Raises:
        ValueError: any other value (the message lists the choices).
    """
    if which not in TRAINABLE:
        raise ValueError(f"trainable must be one of {', '.join(map(repr, TRAINABLE))}, got {which!r}")
    return which


def trainable_parameters(model: nn.Module, which: Trainable) -> list[tuple[str, nn.Parameter]]:
    """The ``(name, parameter)`` pairs of ``model`` that ``which`` selects, in ``named_parameters`` order.

    A student (:class:`~lit_dof.students.LitDofForCausalLM`) is recognised by its ``linear_modules()``; its
    window-only twins (no far term) contribute no feature-map parameters (they are not used).

    Args:
        model: a teacher (any supported causal LM) or a student.
        which: see :data:`Trainable`.

    Returns:
        The selected pairs (empty for ``"feature_maps"`` on a model without twins).

    Raises:
        ValueError: ``which`` is not a :data:`Trainable` value.
    """
    check_trainable(which)
    named = list(model.named_parameters())
    if which == "all":
        return named
    twins = model.linear_modules() if hasattr(model, "linear_modules") else {}
    if which == "feature_maps":
        chosen = {id(p) for twin in twins.values() if getattr(twin, "far_term", True) for p in twin.parameters()}
    else:  # in a student (or hybrid), the layers that run linear attention now
        linear = {i for i, on in enumerate(model.linear_layers) if on} if twins else None
        base = model.model if twins else model  # a student wraps the teacher architecture
        blocks = [layer.module for layer in attention_layers(base) if linear is None or layer.index in linear]
        chosen = {id(p) for block in blocks for p in block.parameters()}
    return [(n, p) for n, p in named if id(p) in chosen]
