"""Feature-dimension planners: the M of each student layer, chosen once the teacher is loaded.

:class:`~lit_dof.pipeline.module.StudentModule` holds one planner (``model.init_args.planner``, a ``class_path`` in
YAML). In ``configure_model`` it calls :meth:`FeatureDimPlanner.check` before loading the teacher, then
:meth:`FeatureDimPlanner.plan` with the loaded teacher; it keeps the returned :class:`FeatureDimPlan` as
``module.plan`` and builds the student from it. :class:`~lit_dof.pipeline.callbacks.PlanFiles` writes the plan's
DoF report (``dof.json``) and figures. (The memory plan of ``lit-dof plan`` is another matter:
:mod:`lit_dof.pipeline.plan`.)

* :class:`FixedPlanner` — one M for every layer (default: the head size C); no DoF estimate.
* :class:`DoFPlanner` — paper Algorithm 1 on teacher batches (or a saved report), then an allocation by strategy.

Planners hold settings only: one instance may plan for several modules.
"""

from __future__ import annotations

import abc
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import lightning as L
import torch
from torch import nn

from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.dof import STRATEGIES, DoFReport, allocate_feature_dims, allocate_head_feature_dims
from lit_dof.dof.estimator import RelativeTo
from lit_dof.dof.report import collect_samples, dof_report
from lit_dof.pipeline.validation import PLANNER_ARGS, check_number
from lit_dof.teacher.families import attention_layers

ALLOCATOR_STRATEGIES = (*STRATEGIES, "dof_head")
"""The strategies of :class:`DoFPlanner`."""


@dataclass(frozen=True)
class StudentSpec:
    """What a planner is told about the student it plans for.

    Attributes:
        teacher_name: the teacher as the module names it (recorded in a DoF report).
        share_kv_maps: one feature map per KV head (True) or per query head.
        sliding_window: the student's sliding-window options (window 0: pure linear attention).
    """

    teacher_name: str
    share_kv_maps: bool = True
    sliding_window: SlidingWindow = SlidingWindow()


@dataclass(frozen=True)
class FeatureDimPlan:
    """The feature dimensions a student is built with, and what they were derived from.

    Attributes:
        feature_dims: per layer, M (an int) or, per KV head, a list of M (``dof_head``); softmax layers get C.
        strategy: how they were allocated: ``"fix"``, ``"dof"``, ``"dof_clip"`` or ``"dof_head"``.
        report: the DoF report they come from (``None``: no estimate, e.g. :class:`FixedPlanner`).
    """

    feature_dims: list
    strategy: str
    report: DoFReport | None = None


class FeatureDimPlanner(abc.ABC):
    """Chooses the per-layer feature dimensions of a student (see the module docstring for the call order).

    Another rule is a subclass named by its ``class_path``; like the shipped ones it should hold settings only.
    """

    def check(self, student: StudentSpec) -> None:
        """Refuse settings that cannot plan for ``student``, before the teacher loads (default: accept all).

        Args:
            student: the student's settings.
        """

    @abc.abstractmethod
    def plan(self, teacher: nn.Module, trainer: L.Trainer | None, student: StudentSpec) -> FeatureDimPlan:
        """The feature dimensions of ``student``'s layers.

        Called on every rank with the same settings; every rank must return the same plan (DDP/FSDP check that
        the ranks' students have the same shapes).

        Args:
            teacher: the loaded frozen teacher (sharded with FSDP2 on a device mesh).
            trainer: the trainer building the module (training data, ranks, device); ``None`` outside one.
            student: the student's settings.

        Returns:
            The plan.
        """

    @abc.abstractmethod
    def allocation_settings(self) -> dict[str, Any]:
        """The settings that decide the dimensions given a DoF report: saved in checkpoints and compared when a run
        resumes one (:mod:`lit_dof.pipeline.resume`); how the report is made may change on resume.

        Returns:
            ``{name: value}`` of plain values.
        """


class FixedPlanner(FeatureDimPlanner):
    """M = ``feature_dim`` for every layer (the Fix allocation without a DoF estimate).

    Args:
        feature_dim: M of every layer (default: the teacher's head size C).

    Raises:
        ValueError: ``feature_dim < 1``.
    """

    def __init__(self, feature_dim: int | None = None) -> None:
        if feature_dim is not None and (isinstance(feature_dim, bool) or not isinstance(feature_dim, int)
                                        or feature_dim < 1):  # fmt: skip  # one condition
            raise ValueError(
                f"feature_dim must be >= 1, got {feature_dim!r}: set {PLANNER_ARGS}feature_dim to an integer >= 1, "
                "or null for the teacher's head size"
            )
        self.feature_dim = feature_dim

    def plan(self, teacher: nn.Module, trainer: L.Trainer | None, student: StudentSpec) -> FeatureDimPlan:
        """``feature_dim`` (default C) for each of the teacher's layers; no DoF report.

        Args:
            teacher: the loaded teacher.
            trainer: unused.
            student: unused.

        Returns:
            The plan (strategy ``"fix"``).
        """
        return FeatureDimPlan(_uniform_dims(teacher, self.feature_dim), "fix")

    def allocation_settings(self) -> dict[str, Any]:
        """``{"feature_dim": …}``."""
        return {"feature_dim": self.feature_dim}


class DoFPlanner(FeatureDimPlanner):
    """Estimate the DoF of every layer on teacher batches (Algorithm 1), or read a report, and allocate by it.

    Args:
        strategy: ``"dof"`` (paper), ``"dof_clip"`` (capped at C), ``"fix"`` (C everywhere: the Fix baseline, the
            DoF still estimated for its report) or ``"dof_head"`` (one M per KV head from that head's DoF, C per
            head on average; maps shared per KV head, see lit_dof.dof.allocate_head_feature_dims).
        budget: the mean feature dim C of the allocation per layer (per KV head for ``dof_head``); default: the
            head size, as in the paper. Smaller budgets trade accuracy for speed/state memory.
        multiple_of: round every dim to a multiple of this (kernel tiles); the total budget is kept.
        min_dim: the smallest dim any layer gets (≥ 1; rounded up to ``multiple_of``).
        lam: ridge λ, or ``"auto"``: the λ at which the mean layer DoF is ``target_fraction`` of J
            (lit_dof.dof.select_lambda).
        relative_to: ``None`` (absolute λ), ``"trace"`` or ``"max_eigenvalue"``.
        num_samples: J, the q/k samples kept per head.
        num_batches: training batches captured for the estimate.
        pooling: ``"query_head"`` (paper; 30 × 9 heads on SmolLM2) or ``"kv_head"``.
        target_fraction: with ``lam="auto"``, the mean layer DoF as a fraction of J, in (0, 1).
        report_path: read this ``dof.json`` (a ``predict`` capture's, or a run's own to resume it with its dims)
            instead of estimating.
        seed: sampling seed: which q/k rows the reservoir keeps, and the draws of the ``"auto"`` λ search.
        far_pairs: for a sliding-window student, estimate the DoF of the kernel restricted to query–key pairs
            farther apart than its window (the pairs its linear part serves; sinks excluded) instead of the
            plain pooled DoF.

    The q/k pooled are post-RoPE, except for a sliding-window student whose far term sees them un-rotated
    (``sliding_window.far_rope=False``): then the DoF is that of the kernel on un-rotated q/k, the one its feature
    maps approximate.

    Under DDP/FSDP every rank captures its share of the batches (merged exactly) and computes the DoF of 1 / world
    of the layers on its own device (lit_dof.dof.sharded.sharded_head_dof); every rank then holds rank 0's report
    (with ``report_path``, rank 0 reads it). Under FSDP2 the teacher is already sharded (the forwards gather one
    decoder layer at a time).

    Raises:
        ValueError: an unknown strategy, ``budget``, ``multiple_of`` or ``min_dim`` < 1, a λ that is not a finite
            number > 0 or ``"auto"``, ``"auto"`` with ``relative_to``, ``num_samples`` < 2, ``num_batches`` < 1, or
            ``target_fraction`` outside (0, 1).
    """

    def __init__(
        self,
        strategy: Literal["dof", "dof_clip", "fix", "dof_head"] = "dof",
        budget: int | None = None,
        multiple_of: int = 1,
        min_dim: int = 1,
        lam: float | str = "auto",
        relative_to: RelativeTo | None = None,
        num_samples: int = 1024,
        num_batches: int = 8,
        pooling: Literal["query_head", "kv_head"] = "query_head",
        target_fraction: float = 0.25,
        report_path: str | None = None,
        seed: int = 0,
        far_pairs: bool = False,
    ) -> None:
        if strategy not in ALLOCATOR_STRATEGIES:
            raise ValueError(f"strategy must be one of {ALLOCATOR_STRATEGIES}, got {strategy!r}")
        if lam == "auto" and relative_to is not None:
            raise ValueError("lam='auto' selects an absolute ridge; do not combine it with relative_to")
        lam = lam if lam == "auto" else _number(lam)
        _check_settings(budget=budget, multiple_of=multiple_of, min_dim=min_dim, lam=lam, num_samples=num_samples,
                        num_batches=num_batches, target_fraction=target_fraction)  # fmt: skip  # packed args
        self.strategy, self.budget, self.multiple_of, self.min_dim = strategy, budget, multiple_of, min_dim
        self.lam = lam
        self.relative_to, self.num_samples, self.num_batches = relative_to, num_samples, num_batches
        self.pooling, self.target_fraction, self.report_path = pooling, target_fraction, report_path
        self.seed, self.far_pairs = seed, far_pairs

    def allocation_settings(self) -> dict[str, Any]:
        """``strategy``, ``multiple_of``, ``min_dim`` and ``budget``: the estimate's settings may change on resume
        (a resumed run rebuilds its dims from its own ``dof.json`` via ``report_path``)."""
        return {"strategy": self.strategy, "multiple_of": self.multiple_of, "min_dim": self.min_dim,
                "budget": self.budget}  # fmt: skip  # compact dict

    def check(self, student: StudentSpec) -> None:
        """Refuse what would fail after the teacher loads and the DoF is estimated.

        Args:
            student: the student's settings.

        Raises:
            ValueError: ``far_pairs`` for a student without a sliding window; ``dof_head`` with one map per query
                head (``share_kv_maps=False``).
            FileNotFoundError: ``report_path`` names no file.
        """
        if self.far_pairs and not student.sliding_window.enabled:
            raise ValueError(
                "DoFPlanner far_pairs needs a sliding-window student: set model.init_args.sliding_window.window"
            )
        if self.strategy == "dof_head" and not student.share_kv_maps:
            raise ValueError("DoFPlanner strategy 'dof_head' gives one M per KV head: it needs share_kv_maps=True")
        if self.report_path and not os.path.isfile(self.report_path):
            raise FileNotFoundError(f"DoFPlanner report_path {self.report_path!r}: no such file")

    def plan(self, teacher: nn.Module, trainer: L.Trainer | None, student: StudentSpec) -> FeatureDimPlan:
        """Capture q/k samples on every rank, estimate the degrees of freedom (or load ``report_path``), give every
        rank rank 0's report and allocate by ``strategy``.

        Args:
            teacher: the loaded teacher.
            trainer: the trainer whose datamodule's training batches are captured (``None``: only with
                ``report_path``).
            student: the student's settings.

        Returns:
            The plan, with its DoF report.

        Raises:
            ValueError: an estimate without a trainer and datamodule.
        """
        report = self._report(teacher, trainer, student)
        return FeatureDimPlan(self._allocate(report, teacher), self.strategy, report)

    def _report(self, teacher: nn.Module, trainer: L.Trainer | None, student: StudentSpec) -> DoFReport:
        if self.report_path is None and (trainer is None or trainer.datamodule is None):
            raise ValueError(
                "DoFPlanner estimates the DoF on training batches: it needs a trainer with a datamodule "
                "(or report_path, or a FixedPlanner)"
            )
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        samples = None if self.report_path else self._capture(teacher, trainer, student)  # every rank: its share
        report = None
        if self.report_path is None or not distributed or torch.distributed.get_rank() == 0:
            report = self._estimate(teacher, trainer, student, samples, distributed)  # the layers split over ranks
        if distributed:  # every rank must build identical twins (DDP/FSDP check shapes): rank 0's report holds
            box = [report]
            torch.distributed.broadcast_object_list(box, src=0)
            report = box[0]
        return report

    def _capture(self, teacher: nn.Module, trainer: L.Trainer, student: StudentSpec):
        """Each rank captures its share of the ``num_batches`` global batches (global batch g on rank
        g % world, from that rank's own shard of the stream), keyed by g, and the reservoirs are merged exactly
        (:meth:`~lit_dof.teacher.capture.QKReservoir.all_gather`): every rank ends with the sample one process
        would draw from the union. A sharded (FSDP2) teacher gathers its layers in every forward, a collective:
        ranks with fewer batches run empty forwards until all have run as many. Returns ``(reservoir, tokens,
        seconds)``."""
        start = time.perf_counter()
        rank, world = trainer.global_rank, trainer.world_size
        window = student.sliding_window
        pool = {"far_window": window.window, "sink_tokens": window.sink_tokens} if self.far_pairs else {}
        pool["unrotated"] = window.far_unrotated  # the kernel the far term's maps approximate
        keys = list(range(rank, self.num_batches, world))
        loader = trainer.datamodule.train_dataloader()
        batches = [batch for _, batch in zip(keys, loader)]
        reservoir, tokens = collect_samples(teacher, batches, self.num_samples, pooling=self.pooling, seed=self.seed,
                                            keys=keys, progress=trainer.is_global_zero,
                                            **pool)  # fmt: skip  # packed args
        _pad_sharded_forwards(teacher, len(range(0, self.num_batches, world)) - len(keys), trainer.strategy.root_device)
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            reservoir.all_gather()
            total = torch.tensor([tokens], dtype=torch.float64, device=trainer.strategy.root_device)  # NCCL: on the GPU
            torch.distributed.all_reduce(total)
            tokens = int(total.item())
        return reservoir, tokens, time.perf_counter() - start

    def _estimate(self, teacher, trainer, student: StudentSpec, samples, distributed: bool) -> DoFReport:
        if self.report_path:
            return DoFReport.load(self.report_path)
        reservoir, tokens, seconds = samples
        report = dof_report(teacher, reservoir, tokens, self.lam, relative_to=self.relative_to, pooling=self.pooling,
                            target_fraction=self.target_fraction, seed=self.seed, name=student.teacher_name,
                            progress=trainer.is_global_zero, split_across_ranks=distributed,
                            device=trainer.strategy.root_device)  # fmt: skip  # packed args
        report.seconds["capture"] = seconds
        return report

    def _allocate(self, report: DoFReport, teacher: nn.Module) -> list:
        """The dims by ``strategy``: ``fix`` C (``budget``) everywhere, ``dof``/``dof_clip`` per layer from the
        layer DoF, ``dof_head`` per KV head; softmax layers get C (unused)."""
        if self.strategy == "fix":
            return _uniform_dims(teacher, self.budget)
        if self.strategy == "dof_head":
            return self._per_head(report, teacher)
        lin = [d for d, ok in zip(report.layer_dof, report.linearizable) if ok]
        dims = iter(allocate_feature_dims(lin, self.budget or report.head_size, self.strategy,
                                          multiple_of=self.multiple_of, min_dim=self.min_dim,
                                          num_samples=report.num_samples))  # fmt: skip  # packed args
        return [next(dims) if ok else report.head_size for ok in report.linearizable]

    def _per_head(self, report: DoFReport, teacher: nn.Module) -> list:
        """``dof_head``: per linearisable layer one M per KV head; other layers get C (unused)."""
        layers = [layer for layer, ok in zip(attention_layers(teacher), report.linearizable) if ok]
        heads = [h for h, ok in zip(report.head_dof, report.linearizable) if ok]
        group = layers[0].num_heads // layers[0].num_kv_heads if report.pooling == "query_head" else 1
        dims = iter(allocate_head_feature_dims(heads, self.budget or report.head_size, heads_per_map=group,
                                               multiple_of=self.multiple_of, min_dim=self.min_dim,
                                               num_samples=report.num_samples))  # fmt: skip  # packed args
        return [next(dims) if ok else report.head_size for ok in report.linearizable]


def _number(value):
    """``value`` as a float where it reads as one (a YAML string ``"1e-3"``), else unchanged (refused later)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _check_settings(*, budget, multiple_of, min_dim, lam, num_samples, num_batches, target_fraction) -> None:
    """Refuse :class:`DoFPlanner` settings that would fail only after the teacher loads and its q/k are captured."""
    if budget is not None:
        check_number("budget", budget, minimum=1, integer=True, option=PLANNER_ARGS, example=64,
                     what="mean feature dim per layer; null: the head size")  # fmt: skip  # packed args
    check_number("multiple_of", multiple_of, minimum=1, integer=True, option=PLANNER_ARGS, example=1,
                 what="every dim is rounded to a multiple of it")  # fmt: skip  # packed args
    check_number("min_dim", min_dim, minimum=1, integer=True, option=PLANNER_ARGS, example=8,
                 what="the smallest feature dim any layer gets")  # fmt: skip  # packed args
    if lam != "auto":
        check_number("lam", lam, minimum=0.0, open_min=True, option=PLANNER_ARGS, example="auto",
                     what="the ridge λ of the DoF", requirement="a finite number > 0 or 'auto'")  # fmt: skip
    check_number("num_samples", num_samples, minimum=2, integer=True, option=PLANNER_ARGS, example=1024,
                 what="J, the q/k samples kept per head")  # fmt: skip  # packed args
    check_number("num_batches", num_batches, minimum=1, integer=True, option=PLANNER_ARGS, example=8,
                 what="training batches captured for the estimate")  # fmt: skip  # packed args
    check_number("target_fraction", target_fraction, minimum=0.0, maximum=1.0, open_min=True, open_max=True,
                 option=PLANNER_ARGS, example=0.25,
                 what="with lam='auto', the mean layer DoF as a fraction of J")  # fmt: skip  # packed args


def _uniform_dims(teacher: nn.Module, dim: int | None) -> list[int]:
    """``dim`` (default: the head size C) for each of the teacher's attention layers."""
    layers = attention_layers(teacher)
    return [dim or layers[0].head_dim] * len(layers)


def _pad_sharded_forwards(teacher: nn.Module, count: int, device: torch.device) -> None:
    """Run ``count`` unrecorded one-token forwards of a teacher sharded with FSDP2 (its all-gathers are collectives
    every rank must join; the input's shape does not matter to them); nothing for an unsharded teacher."""
    from torch.distributed.fsdp import FSDPModule

    if count <= 0 or not isinstance(teacher, FSDPModule):
        return
    with torch.no_grad():
        for _ in range(count):
            teacher(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
