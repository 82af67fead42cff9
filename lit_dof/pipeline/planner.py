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
from lit_dof.dof import STRATEGIES, DoFReport
from lit_dof.dof.estimator import RelativeTo
from lit_dof.dof.report import collect_samples, dof_report
from lit_dof.pipeline.allocation import AttentionShape, FeatureDimOutlook, allocate_from_report, uniform_dims
from lit_dof.pipeline.validation import PLANNER_ARGS, as_number, check_dof_planner
from lit_dof.teacher.sharded import pad_sharded_forwards

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

    def outlook(self, shape: AttentionShape) -> FeatureDimOutlook:
        """What this planner's dims will be, told before any teacher loads (``lit-dof plan`` sizes memory by it).

        The default knows nothing of the rule: C (the head size) on average and in any one layer, no DoF
        estimate; a subclass whose dims differ overrides it.

        Args:
            shape: the teacher's attention layout.

        Returns:
            the dims where they are known before the fit, else a mean and a bound.
        """
        return FeatureDimOutlook(None, shape.head_dim, shape.head_dim)

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
        multiple_of: round M up to a multiple of this (kernel tiles on a GPU: ``configs/trainer/gpu.yaml`` sets 16).

    Raises:
        ValueError: ``feature_dim`` or ``multiple_of`` < 1 or not an integer.
    """

    def __init__(self, feature_dim: int | None = None, multiple_of: int = 1) -> None:
        for name, value in (("feature_dim", feature_dim), ("multiple_of", multiple_of)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                default = ", or null for the teacher's head size" if name == "feature_dim" else ""
                raise ValueError(
                    f"{name} must be >= 1, got {value!r}: set {PLANNER_ARGS}{name} to an integer >= 1{default}"
                )
        self.feature_dim, self.multiple_of = feature_dim, multiple_of

    def _dims(self, shape: AttentionShape) -> list[int]:
        """``feature_dim`` (default C) rounded up to :attr:`multiple_of`, for each layer."""
        return [-(-m // self.multiple_of) * self.multiple_of for m in uniform_dims(shape, self.feature_dim)]

    def plan(self, teacher: nn.Module, trainer: L.Trainer | None, student: StudentSpec) -> FeatureDimPlan:
        """``feature_dim`` (default C, rounded up to ``multiple_of``) for each of the teacher's layers; no DoF report.

        Args:
            teacher: the loaded teacher.
            trainer: unused.
            student: unused.

        Returns:
            The plan (strategy ``"fix"``).
        """
        return FeatureDimPlan(self._dims(AttentionShape.of(teacher)), "fix")

    def outlook(self, shape: AttentionShape) -> FeatureDimOutlook:
        """The dims exactly (``feature_dim``, default C, rounded up to ``multiple_of``, everywhere); no DoF estimate."""
        dims = self._dims(shape)
        return FeatureDimOutlook(dims, dims[0], dims[0])

    def allocation_settings(self) -> dict[str, Any]:
        """``{"feature_dim": …}``, and ``multiple_of`` when it rounds (runs checkpointed before it resume)."""
        return {"feature_dim": self.feature_dim, **({"multiple_of": self.multiple_of} if self.multiple_of > 1 else {})}


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
        lam = lam if lam == "auto" else as_number(lam)
        check_dof_planner(
            budget=budget,
            multiple_of=multiple_of,
            min_dim=min_dim,
            lam=lam,
            num_samples=num_samples,
            num_batches=num_batches,
            target_fraction=target_fraction,
        )
        self.strategy, self.budget, self.multiple_of, self.min_dim = strategy, budget, multiple_of, min_dim
        self.lam = lam
        self.relative_to, self.num_samples, self.num_batches = relative_to, num_samples, num_batches
        self.pooling, self.target_fraction, self.report_path = pooling, target_fraction, report_path
        self.seed, self.far_pairs = seed, far_pairs

    def allocation_settings(self) -> dict[str, Any]:
        """``strategy``, ``multiple_of``, ``min_dim`` and ``budget``: the estimate's settings may change on resume
        (a resumed run rebuilds its dims from its own ``dof.json`` via ``report_path``)."""
        return {
            "strategy": self.strategy,
            "multiple_of": self.multiple_of,
            "min_dim": self.min_dim,
            "budget": self.budget,
        }

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
        return FeatureDimPlan(self._allocate(report, AttentionShape.of(teacher)), self.strategy, report)

    def outlook(self, shape: AttentionShape) -> FeatureDimOutlook:
        """The dims exactly where they need no estimate (strategy ``fix``, or a ``report_path`` to allocate from, by
        the fit's own allocation); else ``budget`` (default C) on average and up to 3 × it in one layer for ``dof``
        and ``dof_head`` (C for ``dof_clip``), after an estimate of ``num_samples`` per head unless a report is read.

        Args:
            shape: the teacher's attention layout.

        Raises:
            FileNotFoundError, ValueError: ``report_path`` names no file, or a report the allocation refuses.
        """
        size = self.budget or shape.head_dim
        estimate = {} if self.report_path else {"estimate_samples": self.num_samples, "estimate_pooling": self.pooling}
        if self.report_path:
            dims = self._allocate(DoFReport.load(self.report_path), shape)
        elif self.strategy == "fix":
            dims = uniform_dims(shape, self.budget)
        else:  # a layer's M reaches about 3 × the budget under "dof" (the DoF of one layer may be that far above)
            return FeatureDimOutlook(None, size, size * (1 if self.strategy == "dof_clip" else 3), **estimate)
        flat = [max(m) if isinstance(m, list) else m for m in dims]
        return FeatureDimOutlook(dims, -(-sum(flat) // len(flat)), max(flat), **estimate)

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
        reservoir, tokens = collect_samples(
            teacher,
            batches,
            self.num_samples,
            pooling=self.pooling,
            seed=self.seed,
            keys=keys,
            progress=trainer.is_global_zero,
            **pool,
        )
        pad_sharded_forwards(teacher, len(range(0, self.num_batches, world)) - len(keys), trainer.strategy.root_device)
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
        report = dof_report(
            teacher,
            reservoir,
            tokens,
            self.lam,
            relative_to=self.relative_to,
            pooling=self.pooling,
            target_fraction=self.target_fraction,
            seed=self.seed,
            name=student.teacher_name,
            progress=trainer.is_global_zero,
            split_across_ranks=distributed,
            device=trainer.strategy.root_device,
        )
        report.seconds["capture"] = seconds
        return report

    def _allocate(self, report: DoFReport, shape: AttentionShape) -> list:
        """The dims of ``report`` by this planner's settings (:func:`~lit_dof.pipeline.allocation.allocate_from_report`:
        the one allocation of the fit and of ``lit-dof plan``)."""
        return allocate_from_report(report, shape, self.strategy, self.budget, self.multiple_of, self.min_dim)
