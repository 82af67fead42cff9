"""DoF callbacks: estimate the DoF on teacher batches (Algorithm 1) and allocate the feature dimensions.

Both act while the student is being built (:meth:`lit_dof.pipeline.module.StudentModule.configure_model`
calls ``on_teacher_ready`` — estimation first, then allocation), i.e. before optimizers exist and before
DDP/FSDP wrap the model; at ``on_fit_start`` the DoF figures go to ``<log_dir>/figures/`` as PNG files and to the
configured logger (:func:`~lit_dof.pipeline.run_files.log_figure`).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Literal

import lightning as L
import torch

from lit_dof.dof import STRATEGIES, DoFReport, allocate_feature_dims, allocate_head_feature_dims
from lit_dof.dof.estimator import RelativeTo
from lit_dof.dof.report import collect_samples, dof_report
from lit_dof.pipeline.run_files import log_figure, log_text, run_log_dir
from lit_dof.students.surgery import layer_mean_dims
from lit_dof.teacher.families import attention_layers

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ALLOCATOR_STRATEGIES = (*STRATEGIES, "dof_head")


class DoFEstimator(L.Callback):
    """Run Algorithm 1 on teacher batches (or read a report) and write ``dof.json`` to the log directory.

    Args:
        lam: ridge λ, or ``"auto"``: the λ at which the mean layer DoF is ``target_fraction`` of J
            (lit_dof.dof.select_lambda).
        relative_to: ``None`` (absolute λ), ``"trace"`` or ``"max_eigenvalue"``.
        num_samples: J, the q/k samples kept per head.
        num_batches: training batches captured for the estimate.
        pooling: ``"query_head"`` (paper; 30 × 9 heads on SmolLM2) or ``"kv_head"``.
        target_fraction: with ``lam="auto"``, the mean layer DoF as a fraction of J, in (0, 1).
        report_path: read this ``dof.json`` (e.g. from a ``predict`` capture) instead of estimating.
        enabled: False skips the estimate (allocation then needs ``strategy="fix"``).
        seed: sampling seed: which q/k rows the reservoir keeps, and the draws of the ``"auto"`` λ search.
        far_pairs: for a sliding-window student, estimate the DoF of the kernel restricted to query–key pairs
            farther apart than its window (the pairs its linear part serves; sinks excluded) instead of the
            plain pooled DoF.

    Under DDP/FSDP every rank captures its share of the batches (merged exactly) and computes the DoF of 1 / world
    of the layers on its own device (:func:`~lit_dof.dof.sharded.sharded_head_dof`); every rank then holds
    rank 0's report. Under FSDP2 the teacher it sees is already sharded (the forwards gather one decoder layer at a
    time; :meth:`lit_dof.pipeline.module.StudentModule.configure_model`).

    Raises:
        ValueError: ``far_pairs`` for a student without a sliding window.
    """

    planning_stage = "estimate"

    def __init__(
        self,
        lam: float | str = "auto",
        relative_to: RelativeTo | None = None,
        num_samples: int = 1024,
        num_batches: int = 8,
        pooling: Literal["query_head", "kv_head"] = "query_head",
        target_fraction: float = 0.25,
        report_path: str | None = None,
        enabled: bool = True,
        seed: int = 0,
        far_pairs: bool = False,
    ) -> None:
        self.lam = lam if lam == "auto" else float(lam)
        self.relative_to, self.num_samples, self.num_batches = relative_to, num_samples, num_batches
        self.pooling, self.target_fraction, self.report_path = pooling, target_fraction, report_path
        self.enabled, self.seed, self.far_pairs = enabled, seed, far_pairs
        self.report: DoFReport | None = None
        self.log_dir: str | None = None

    def on_teacher_ready(self, trainer: L.Trainer, pl_module, teacher) -> None:
        """Capture q/k samples on every rank, estimate the degrees of freedom (or load ``report_path``), give every
        rank rank 0's report and set ``pl_module.dof_report``; rank 0 writes ``<log_dir>/dof.json``."""
        if not self.enabled:
            return
        log_dir = self.log_dir = run_log_dir(trainer)  # a collective under DDP (a broadcast): every rank asks
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        samples = None if self.report_path else self._capture(trainer, pl_module, teacher)  # every rank: its share
        report = None
        if self.report_path is None or not distributed or torch.distributed.get_rank() == 0:
            report = self._estimate(trainer, pl_module, teacher, samples, distributed)  # the layers split over ranks
        if distributed:  # every rank must build identical twins (DDP/FSDP check shapes): rank 0's report holds
            box = [report]
            torch.distributed.broadcast_object_list(box, src=0)
            report = box[0]
        self.report = report
        pl_module.dof_report = report
        if trainer.is_global_zero and log_dir:
            self.report.save(os.path.join(log_dir, "dof.json"))

    def _capture(self, trainer: L.Trainer, pl_module, teacher):
        """Each rank captures its share of the ``num_batches`` global batches (global batch g on rank
        g % world, from that rank's own shard of the stream), keyed by g, and the reservoirs are merged exactly
        (:meth:`~lit_dof.teacher.capture.QKReservoir.all_gather`): every rank ends with the sample one process
        would draw from the union. A sharded (FSDP2) teacher gathers its layers in every forward, a collective:
        ranks with fewer batches run empty forwards until all have run as many. Returns ``(reservoir, tokens,
        seconds)``."""
        start = time.perf_counter()
        rank, world = trainer.global_rank, trainer.world_size
        window = pl_module.sliding_window
        far = {}
        if self.far_pairs:
            if not window.enabled:
                raise ValueError(
                    "dof.far_pairs needs a sliding-window student: set model.init_args.sliding_window.window"
                )
            far = {"far_window": window.window, "sink_tokens": window.sink_tokens}
        keys = list(range(rank, self.num_batches, world))
        loader = trainer.datamodule.train_dataloader()
        batches = [batch for _, batch in zip(keys, loader)]
        reservoir, tokens = collect_samples(teacher, batches, self.num_samples, pooling=self.pooling, seed=self.seed,
                                            keys=keys, progress=trainer.is_global_zero,
                                            **far)  # fmt: skip  # packed args
        _pad_sharded_forwards(teacher, len(range(0, self.num_batches, world)) - len(keys), trainer.strategy.root_device)
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            reservoir.all_gather()
            total = torch.tensor([tokens], dtype=torch.float64, device=trainer.strategy.root_device)  # NCCL: on the GPU
            torch.distributed.all_reduce(total)
            tokens = int(total.item())
        return reservoir, tokens, time.perf_counter() - start

    def _estimate(self, trainer: L.Trainer, pl_module, teacher, samples, distributed: bool) -> DoFReport:
        if self.report_path:
            return DoFReport.load(self.report_path)
        reservoir, tokens, seconds = samples
        report = dof_report(teacher, reservoir, tokens, self.lam, relative_to=self.relative_to, pooling=self.pooling,
                            target_fraction=self.target_fraction, seed=self.seed, name=pl_module.teacher_name,
                            progress=trainer.is_global_zero, split_across_ranks=distributed,
                            device=trainer.strategy.root_device)  # fmt: skip  # packed args
        report.seconds["capture"] = seconds
        return report

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        """On rank 0, save the per-head DoF heat map and the feature-dimension bar chart as PNG files (and the table
        as markdown) under ``<log_dir>/figures/`` and send them to the configured loggers (TensorBoard's
        ``add_figure``/``add_text``, W&B's ``log_image``)."""
        if self.report is None or not trainer.is_global_zero or not self.log_dir:
            return
        dims = pl_module.feature_dims
        log_figure(trainer.loggers, self.log_dir, "dof/heads", dof_heatmap(self.report))
        log_figure(trainer.loggers, self.log_dir, "dof/feature_dims", dims_bar_chart(self.report, dims))
        log_text(trainer.loggers, self.log_dir, "dof/table", dims_table(self.report, dims))


def _pad_sharded_forwards(teacher: torch.nn.Module, count: int, device: torch.device) -> None:
    """Run ``count`` unrecorded one-token forwards of a teacher sharded with FSDP2 (its all-gathers are collectives
    every rank must join; the input's shape does not matter to them); nothing for an unsharded teacher."""
    from torch.distributed.fsdp import FSDPModule

    if count <= 0 or not isinstance(teacher, FSDPModule):
        return
    with torch.no_grad():
        for _ in range(count):
            teacher(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)


class FeatureDimAllocator(L.Callback):
    """Set the student's per-layer feature dims from the DoF report (``dof``, ``dof_clip``) or to C (``fix``).

    Args:
        strategy: ``"dof"`` (paper), ``"dof_clip"`` (capped at C), ``"fix"`` (C everywhere; the Fix baseline)
            or ``"dof_head"`` (one M per KV head from that head's DoF, C per head on average; maps shared per
            KV head, see lit_dof.dof.allocate_head_feature_dims).
        multiple_of: round every dim to a multiple of this (kernel tiles); the total budget is kept.
        min_dim: the smallest dim any layer gets (≥ 1; rounded up to ``multiple_of``).
        budget: the mean feature dim C of the allocation per layer (per KV head for ``dof_head``); default:
            the head size, as in the paper. Smaller budgets trade accuracy for speed/state memory.

    Raises:
        ValueError: unknown strategy, ``budget < 1``, or ``dof``/``dof_clip`` without a DoF report.
    """

    planning_stage = "allocate"

    def __init__(self, strategy: Literal["dof", "dof_clip", "fix", "dof_head"] = "dof", multiple_of: int = 1,
                 min_dim: int = 1, budget: int | None = None) -> None:  # fmt: skip  # packed signature
        if strategy not in ALLOCATOR_STRATEGIES:
            raise ValueError(f"strategy must be one of {ALLOCATOR_STRATEGIES}, got {strategy!r}")
        if budget is not None and budget < 1:
            raise ValueError(f"budget (mean feature dim per layer) must be >= 1, got {budget}")
        self.strategy, self.multiple_of, self.min_dim, self.budget = strategy, multiple_of, min_dim, budget

    def state_dict(self) -> dict:
        """The allocation settings, saved in checkpoints: a resumed run is checked against them
        (:mod:`lit_dof.pipeline.resume`); nothing is restored from them."""
        return {
            "strategy": self.strategy,
            "multiple_of": self.multiple_of,
            "min_dim": self.min_dim,
            "budget": self.budget,
        }

    def on_teacher_ready(self, trainer: L.Trainer, pl_module, teacher) -> None:
        """Set ``pl_module.feature_dims`` from the DoF report by ``strategy`` (``fix``: C everywhere).

        Raises:
            ValueError: ``dof``/``dof_clip``/``dof_head`` without a DoF report.
        """
        report = pl_module.dof_report
        if self.strategy == "fix":
            pl_module.feature_dims = None  # the module's feature_dim (default C) everywhere
            if self.budget is not None:
                pl_module.feature_dim = self.budget
            return
        if report is None:
            raise ValueError(f"allocator strategy {self.strategy!r} needs a DoF report: enable the DoFEstimator")
        if self.strategy == "dof_head":
            pl_module.feature_dims = self._per_head(report, teacher, pl_module)
            return
        lin = [d for d, ok in zip(report.layer_dof, report.linearizable) if ok]
        dims = iter(allocate_feature_dims(lin, self.budget or report.head_size, self.strategy,
                                          multiple_of=self.multiple_of, min_dim=self.min_dim,
                                          num_samples=report.num_samples))  # fmt: skip  # packed args
        pl_module.feature_dims = [next(dims) if ok else report.head_size for ok in report.linearizable]

    def _per_head(self, report: DoFReport, teacher, pl_module) -> list:
        """``dof_head``: per linearisable layer one M per KV head; other layers get C (unused)."""
        if not getattr(pl_module, "share_kv_maps", True):
            raise ValueError("allocator strategy 'dof_head' gives one M per KV head: it needs share_kv_maps=True")
        layers = [layer for layer, ok in zip(attention_layers(teacher), report.linearizable) if ok]
        heads = [h for h, ok in zip(report.head_dof, report.linearizable) if ok]
        group = layers[0].num_heads // layers[0].num_kv_heads if report.pooling == "query_head" else 1
        dims = iter(allocate_head_feature_dims(heads, self.budget or report.head_size, heads_per_map=group,
                                               multiple_of=self.multiple_of, min_dim=self.min_dim,
                                               num_samples=report.num_samples))  # fmt: skip  # packed args
        return [next(dims) if ok else report.head_size for ok in report.linearizable]


def _figure(figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """A figure with one axes on its own Agg canvas (no pyplot, no ``matplotlib.use``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def dof_heatmap(report: DoFReport) -> Figure:
    """Per-head DoF, layers × heads (softmax layers blank).

    Args:
        report: the DoF report.

    Returns:
        A figure on its own Agg canvas, outside pyplot (the process's matplotlib backend is left alone).
    """
    rows = [
        r if r is not None else [float("nan")] * len(next(x for x in report.head_dof if x)) for r in report.head_dof
    ]
    fig, ax = _figure(figsize=(6, 0.18 * len(rows) + 1.5))
    image = ax.imshow(torch.tensor(rows).numpy(), aspect="auto", cmap="viridis")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"DoF per head (λ = 2^{torch.tensor(report.lam).log2():.1f}, J = {report.num_samples})")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def dims_bar_chart(report: DoFReport, dims: list[int] | None) -> Figure:
    """Allocated feature dims per layer (per-head dims: their mean over KV heads) and the uniform budget C.

    Args:
        report: the DoF report.
        dims: the allocated dims; None plots the uniform allocation.

    Returns:
        A figure on its own Agg canvas, outside pyplot (the process's matplotlib backend is left alone).
    """
    dims = layer_mean_dims(dims or report.feature_dims("fix"))  # per-head dims: the mean over KV heads
    fig, ax = _figure(figsize=(7, 3))
    ax.bar(range(len(dims)), dims)
    ax.axhline(report.head_size, color="k", linestyle="--", linewidth=1, label=f"C = {report.head_size}")
    ax.set_xlabel("layer")
    ax.set_ylabel("feature dim M")
    ax.legend()
    fig.tight_layout()
    return fig


def dims_table(report: DoFReport, dims: list[int] | None) -> str:
    """Markdown table: layer, DoF, allocated dim."""
    dims = dims or report.feature_dims("fix")
    lines = ["| layer | DoF | M |", "|---|---|---|"]
    for i, (dof, m) in enumerate(zip(report.layer_dof, dims)):
        lines.append(f"| {i} | {'softmax' if dof is None else f'{dof:.1f}'} | {m} |")
    return "\n".join(lines)
