"""The plan's files: the DoF report ``dof.json`` and the DoF figures of a run, in its log directory.

:class:`PlanFiles` (always present in ``lit-dof fit``, the ``plan_files:`` group) reads the feature-dimension plan
that the student module made while it was built (:attr:`lit_dof.pipeline.module.StudentModule.plan`,
:mod:`lit_dof.pipeline.planner`) and, at ``on_fit_start``, writes its DoF report to ``<log_dir>/dof.json`` and the
figures to ``<log_dir>/figures/`` as PNG files and to the configured logger
(:func:`~lit_dof.pipeline.run_files.log_figure`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import lightning as L
import torch

from lit_dof.dof import DoFReport
from lit_dof.pipeline.module import StudentModule
from lit_dof.pipeline.run_files import log_figure, log_text, run_log_dir
from lit_dof.students.surgery import layer_mean_dims

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class PlanFiles(L.Callback):
    """Write the student's DoF report (``<log_dir>/dof.json``) and its figures at the start of ``fit``.

    The figures are the per-head DoF heat map, the feature-dims bar chart and the table; all is written on rank 0,
    nothing for a plan without a DoF report (``FixedPlanner``) or a module without a plan.

    Args:
        figures: False writes ``dof.json`` only.
    """

    def __init__(self, figures: bool = True) -> None:
        self.figures = figures

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the files (the log directory is asked on every rank: a collective under DDP)."""
        plan = pl_module.plan if isinstance(pl_module, StudentModule) else None
        if plan is None or plan.report is None:
            return
        log_dir = run_log_dir(trainer)
        if not trainer.is_global_zero or not log_dir:
            return
        plan.report.save(os.path.join(log_dir, "dof.json"))
        if self.figures:
            log_figure(trainer.loggers, log_dir, "dof/heads", dof_heatmap(plan.report))
            log_figure(trainer.loggers, log_dir, "dof/feature_dims", dims_bar_chart(plan.report, plan.feature_dims))
            log_text(trainer.loggers, log_dir, "dof/table", dims_table(plan.report, plan.feature_dims))


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


def dims_bar_chart(report: DoFReport, dims: list) -> Figure:
    """Allocated feature dims per layer (per-head dims: their mean over KV heads) and the uniform budget C.

    Args:
        report: the DoF report.
        dims: the allocated dims, per layer an int or a list per KV head.

    Returns:
        A figure on its own Agg canvas, outside pyplot (the process's matplotlib backend is left alone).
    """
    dims = layer_mean_dims(dims)  # per-head dims: the mean over KV heads
    fig, ax = _figure(figsize=(7, 3))
    ax.bar(range(len(dims)), dims)
    ax.axhline(report.head_size, color="k", linestyle="--", linewidth=1, label=f"C = {report.head_size}")
    ax.set_xlabel("layer")
    ax.set_ylabel("feature dim M")
    ax.legend()
    fig.tight_layout()
    return fig


def dims_table(report: DoFReport, dims: list) -> str:
    """The markdown table of :func:`dims_bar_chart`'s arguments: per layer its DoF (``softmax`` for a layer kept
    softmax) and its allocated M (or the list of M per KV head)."""
    lines = ["| layer | DoF | M |", "|---|---|---|"]
    for i, (dof, m) in enumerate(zip(report.layer_dof, dims)):
        lines.append(f"| {i} | {'softmax' if dof is None else f'{dof:.1f}'} | {m} |")
    return "\n".join(lines)
