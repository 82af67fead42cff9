"""The report's figure (``comparison.png``): accuracy (or perplexity) against the feature budget, validation
curves, and each curve relative to its reference row's."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lit_dof.comparison.records import Report
from lit_dof.comparison.summary import mean_of, spread_of
from lit_dof.io import atomic_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot(report: Report, path: Path) -> None:
    """Write the report's figure (:func:`figure`) as a PNG, atomically.

    Args:
        report: :func:`~lit_dof.comparison.collect.collect`'s report.
        path: the PNG file (its folder is created).
    """
    fig = figure(report)
    with atomic_file(path) as handle:
        fig.savefig(handle, format="png", dpi=120)


def figure(report: Report) -> Figure:
    """Average accuracy vs total feature budget (one line per method; held-out perplexity instead in a
    perplexity-only study such as the λ study), validation curves and, where the reference row (Fix with the
    same loss) has one, each curve divided by the reference's at the same step (the λ study's "has the
    ranking stopped changing").

    Args:
        report: :func:`~lit_dof.comparison.collect.collect`'s report.

    Returns:
        A figure drawn on its own Agg canvas, outside pyplot (the process's backend is left alone; nothing to
        close).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    relative = [c for c in report.cells if c.reference and c.fit and c.fit.val_curve and report.reference_curve(c)]
    fig = Figure(figsize=(16 if relative else 11, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if relative else 2)
    ax, bx = axes[:2]
    # Same row, same colour.
    colors = {row: f"C{i % 10}" for i, row in enumerate(dict.fromkeys(c.row for c in report.cells))}
    scored = report.has_scores  # else perplexity-only: the budget panel plots perplexity

    def value(c):
        return c.average if scored else c.ppl

    by_row: dict[str, dict[int, list]] = {}  # row -> budget -> (Σ M, value) of each seed
    for c in report.cells:
        if value(c) is not None and c.kind != "teacher":
            point = ((c.fit.total_features if c.fit else None) or 0, value(c))
            by_row.setdefault(c.row, {}).setdefault(c.budget, []).append(point)
        if c.fit and c.fit.val_curve:
            steps, values = zip(*c.fit.val_curve)
            bx.plot(steps, values, marker="o", color=colors[c.row], label=f"{c.name} (C={c.budget})")
    for name, budgets in sorted(by_row.items()):  # one point per budget: the mean over seeds, bars ± 1 sd
        points = sorted(
            ((mean_of(x for x, _ in seeds), spread_of([y for _, y in seeds])) for seeds in budgets.values()),
            key=lambda point: (point[0], point[1].mean),
        )
        xs, ys = [x for x, _ in points], [p.mean for _, p in points]
        ax.plot(xs, ys, marker="o", color=colors[name], label=name)
        if any(p.sd is not None for _, p in points):
            ax.errorbar(xs, ys, yerr=[p.sd or 0.0 for _, p in points], fmt="none", color=colors[name], capsize=3)
    teacher = report.teacher
    if teacher and value(teacher) is not None:
        ax.axhline(value(teacher), color="k", linestyle="--", label="teacher")
    ax.set_xlabel("total feature budget Σ M (features)")
    ax.set_ylabel("average zero-shot accuracy" if scored else "held-out perplexity (sliding window)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7 if scored else 6)
    else:
        ax.text(
            0.5,
            0.5,
            "no seven-task averages yet" if scored else "no perplexities yet",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    bx.set_xlabel("optimizer step")
    bx.set_ylabel("held-out perplexity (validation)")
    bx.set_yscale("log")
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=6)
    if relative:  # the λ study's question, directly: is each method ahead of Fix, and has that stopped changing?
        cx = axes[2]
        for c in relative:
            reference = report.reference_curve(c)
            shared = [(step, v / reference[step]) for step, v in c.fit.val_curve if step in reference]
            if shared:
                cx.plot(
                    *zip(*shared), marker="o", color=colors[c.row], label=f"{c.name} / {c.reference} (C={c.budget})"
                )
        cx.axhline(1.0, color="k", linestyle="--", label="reference (Fix, same loss)")
        cx.set_xlabel("optimizer step")
        cx.set_ylabel("validation perplexity / reference's (same step)")
        cx.legend(fontsize=6)
    fig.tight_layout()
    return fig
