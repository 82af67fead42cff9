"""Writing the report: ``comparison.json``, ``comparison.md`` and ``comparison.png``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lit_dof.comparison.cells import Comparison
from lit_dof.comparison.collect import collect
from lit_dof.comparison.plots import plot
from lit_dof.comparison.records import Report
from lit_dof.comparison.render import markdown
from lit_dof.comparison.rows import Row
from lit_dof.evaluation.task_data import EXTRA_TASKS, TASKS
from lit_dof.io import atomic_write_json, atomic_write_text


def write_report(
    comparison: Comparison,
    rows: Sequence[Row],
    budgets: Sequence[int],
    report_dir: Path,
    header: str = "",
    seeds: Sequence[int] = (0,),
    carry: bool = True,
) -> Report:
    """``comparison.json``, ``comparison.md`` and ``comparison.png`` in ``report_dir`` (atomic). With ``carry``,
    cells of the ``comparison.json`` already there that have no run directory now are kept (:func:`collect`).

    Args:
        comparison: where the cells are.
        rows: the selected rows.
        budgets: feature budgets C.
        report_dir: the report's folder.
        header: the markdown's first line.
        seeds: training seeds.
        carry: keep the earlier report's cells that have no run directory now.

    Returns:
        The report (:func:`~lit_dof.comparison.collect.collect`).

    Raises:
        ValueError: ``carry`` and an existing ``comparison.json`` that is not a readable report.
    """
    report_dir = Path(report_dir)
    previous = None
    if carry and (report_dir / "comparison.json").is_file():
        try:
            previous = Report.load(report_dir / "comparison.json")
        except ValueError as error:  # not JSON, or not a report
            raise _not_a_report(report_dir, error) from error
    report = collect(comparison, rows, budgets, report_tasks(comparison, previous), seeds=seeds, previous=previous)
    atomic_write_json(report_dir / "comparison.json", report.to_json())
    atomic_write_text(report_dir / "comparison.md", markdown(report, header) + "\n")
    plot(report, report_dir / "comparison.png")
    return report


def report_tasks(comparison: Comparison, previous: Report | None = None) -> list[str]:
    """The report's task columns: the seven zero-shot tasks, then each extra task (5-shot MMLU) that a cell under
    ``comparison.out`` or the earlier report has.

    Args:
        comparison: where the cells are.
        previous: the earlier report (``None``: none).

    Returns:
        The task names, in order.
    """
    earlier = set(previous.tasks if previous else [])
    found = [t for t in EXTRA_TASKS if t in earlier or next(Path(comparison.out).rglob(f"eval/{t}.json"), None)]
    return [*TASKS, *found]


def _not_a_report(report_dir: Path, why: object) -> ValueError:
    return ValueError(
        f"{report_dir / 'comparison.json'} is not a comparison report ({why}): move it away or pass "
        f"--carry false to write the report from the run directories only"
    )
