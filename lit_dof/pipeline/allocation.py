"""The feature dims a planner's settings give a teacher: one allocation for the fit and for ``lit-dof plan``.

The planners (:mod:`lit_dof.pipeline.planner`) call :func:`uniform_dims` and :func:`allocate_from_report` when the
fit builds its student; ``lit-dof plan`` calls the same functions through
:meth:`~lit_dof.pipeline.planner.FeatureDimPlanner.outlook` before any teacher loads. :class:`AttentionShape` is
what the allocation needs of the teacher (read from the loaded teacher in a fit, from its meta-device model in
``lit-dof plan``); :class:`FeatureDimOutlook` is what a planner knows of its dims before the fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lit_dof.dof import DoFReport, allocate_feature_dims, allocate_head_feature_dims


@dataclass(frozen=True)
class AttentionShape:
    """The attention layout of a teacher that an allocation depends on.

    Attributes:
        num_layers: attention layers (linearisable or not). head_dim: C (= d). num_heads: Hq. num_kv_heads: Hk.
        linearizable: per attention layer, whether it gets a linear twin (sliding-window layers stay softmax).
    """

    num_layers: int
    head_dim: int
    num_heads: int
    num_kv_heads: int
    linearizable: tuple[bool, ...]

    @classmethod
    def of(cls, teacher: nn.Module) -> AttentionShape:
        """The shape of ``teacher``'s attention layers (a loaded model or one on the meta device).

        Raises:
            UnsupportedModelError: no supported attention layers (:func:`~lit_dof.teacher.families.attention_layers`).
        """
        from lit_dof.teacher.families import attention_layers

        layers = attention_layers(teacher)
        first = layers[0]
        linearizable = tuple(layer.linearizable for layer in layers)
        return cls(len(layers), first.head_dim, first.num_heads, first.num_kv_heads, linearizable)


@dataclass(frozen=True)
class FeatureDimOutlook:
    """What a planner knows of a student's feature dims before the fit (:meth:`FeatureDimPlanner.outlook`).

    Attributes:
        dims: per attention layer, M (or one M per KV head) exactly as the fit's plan will hold them; ``None`` while
            they depend on a DoF estimate the fit makes first.
        budget: the mean M of a linear layer (with ``dims``: the mean of theirs).
        max_dim: the largest M one layer may get (with ``dims``: their largest).
        estimate_samples: J, the q/k samples per head of the DoF estimate the fit makes before it allocates
            (0: none). estimate_pooling: its pooling, ``"query_head"`` or ``"kv_head"``.
    """

    dims: list | None
    budget: int
    max_dim: int
    estimate_samples: int = 0
    estimate_pooling: str = "query_head"


def uniform_dims(shape: AttentionShape, dim: int | None) -> list[int]:
    """``dim`` (``None``: the head size C) for each of the teacher's attention layers."""
    return [dim or shape.head_dim] * shape.num_layers


def allocate_from_report(
    report: DoFReport, shape: AttentionShape, strategy: str, budget: int | None, multiple_of: int, min_dim: int
) -> list:
    """The feature dims of a student from a DoF report, by ``strategy``.

    Args:
        report: the teacher's DoF report (:class:`~lit_dof.dof.DoFReport`).
        shape: the teacher's attention layout (``dof_head`` groups the query heads of a KV head when the report
            pooled per query head).
        strategy: ``"fix"`` (``budget`` everywhere), ``"dof"``/``"dof_clip"`` (one M per layer from the layer
            DoF) or ``"dof_head"`` (one M per KV head from the heads' DoF).
        budget: the mean M per linear layer (per KV head for ``dof_head``); ``None``: the head size.
        multiple_of: every M is rounded to a multiple of it.
        min_dim: the smallest M any layer gets.

    Returns:
        per attention layer, M (a list of M per KV head for ``dof_head``); softmax layers get C (unused).

    Raises:
        ValueError: what :func:`~lit_dof.dof.allocate_feature_dims` refuses (an unknown strategy, a DoF that cannot
            be allocated).
    """
    if strategy == "fix":
        return uniform_dims(shape, budget)
    size = budget or report.head_size
    if strategy == "dof_head":
        heads = [h for h, ok in zip(report.head_dof, report.linearizable) if ok]
        group = shape.num_heads // shape.num_kv_heads if report.pooling == "query_head" else 1
        dims = allocate_head_feature_dims(
            heads, size, heads_per_map=group, multiple_of=multiple_of, min_dim=min_dim, num_samples=report.num_samples
        )
    else:
        lin = [d for d, ok in zip(report.layer_dof, report.linearizable) if ok]
        dims = allocate_feature_dims(
            lin, size, strategy, multiple_of=multiple_of, min_dim=min_dim, num_samples=report.num_samples
        )
    it = iter(dims)
    return [next(it) if ok else report.head_size for ok in report.linearizable]
