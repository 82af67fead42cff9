"""Gathering the report: every finished cell of the grid, the cells carried over from an earlier
``comparison.json``, and the comparisons between cells of one budget and seed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from lit_dof.comparison.artefacts import CellFiles, fit_state, read_cell
from lit_dof.comparison.cell_records import FinetuneScore, TaskScore
from lit_dof.comparison.control_cells import control_folder, read_control
from lit_dof.comparison.records import Cell, PairedDifference, Report
from lit_dof.comparison.rows import PRIMARY_METRIC, Row, grid
from lit_dof.comparison.summary import mean_of, pair_with_reference, seed_summary
from lit_dof.evaluation.control_record import Control
from lit_dof.evaluation.task_data import TASKS
from lit_dof.records import load_record

if TYPE_CHECKING:
    from lit_dof.comparison.cells import Comparison

Prior = tuple[dict[str, PairedDifference | None], PairedDifference | None] | None
"""A carried cell's paired differences (per task, average) from the report it was carried from."""


def encode_items(values: Sequence[float]) -> str | list[float]:
    """Per-example scores as stored in ``comparison.json``: a string of ``0``/``1`` when every score is 0 or 1
    (accuracies: one byte per example), else the list itself.

    Args:
        values: per-example scores.

    Returns:
        The stored form.
    """
    return "".join(str(int(v)) for v in values) if all(v in (0, 1) for v in values) else list(values)


def decode_items(stored: str | Sequence[float]) -> list[float]:
    """The inverse of :func:`encode_items`.

    Args:
        stored: a stored form.

    Returns:
        The per-example scores as floats.
    """
    return [float(ch) for ch in stored] if isinstance(stored, str) else list(stored)


def _carry(previous: Cell, tasks: Sequence[str]) -> tuple[Cell, dict, Prior]:
    """A cell of an earlier report, as :func:`collect` builds one: scores and per-example items restricted to
    ``tasks``, average recomputed, the comparisons (gap closed, paired differences) left to the caller to recompute;
    its earlier paired differences returned beside it, for cells stored without items."""
    items = {t: decode_items(v) for t, v in previous.items.items() if t in tasks}
    scores = {t: s for t, s in previous.scores.items() if t in tasks}
    cell = replace(
        previous,
        scores=scores,
        average=seven_task_average(scores, tasks),
        carried=True,
        items={t: encode_items(v) for t, v in items.items()},  # kept, so that the next rewrite pairs them again
        gap_closed=None,
        vs_reference={},
        vs_reference_average=None,
    )
    prior = (previous.vs_reference, previous.vs_reference_average) if previous.vs_reference else None
    return cell, items, prior


def collect(
    comparison: Comparison,
    rows: Sequence[Row],
    budgets: Sequence[int],
    tasks: Sequence[str] = TASKS,
    seeds: Sequence[int] = (0,),
    previous: Report | None = None,
) -> Report:
    """Every finished part of every cell (missing parts are ``None``); ``pending`` names the selected rows with
    no cell yet or with a fit still under way (nothing to show). Cells of one budget and seed are compared
    with each other (gap closed, paired differences); ``seed_summary`` (:func:`seed_summary`) pools the seeds.

    ``previous``: an earlier ``comparison.json`` (the report is the durable record; run directories hold
    checkpoints and may be scratch space). A selected cell with nothing under ``comparison.out`` is taken
    whole from it, marked ``carried`` and listed in ``report.carried``; a cell found under ``out`` always
    wins. Each cell keeps its per-example scores (``items``, :func:`encode_items`) so that a carried cell is
    still paired with a re-measured one; a cell from a report written before items were kept keeps its
    earlier paired difference only while its reference row is carried too (the same measurements).

    Args:
        comparison: where the cells are (:class:`~lit_dof.comparison.cells.Comparison`).
        rows: the selected rows.
        budgets: feature budgets C.
        tasks: the report's tasks.
        seeds: training seeds.
        previous: an earlier report to carry cells from (``None``: none).

    Returns:
        The report.
    """
    cells: list[Cell] = []
    items: list[dict] = []  # items[i][task]: cell i's per-example scores of the task's primary metric
    priors: list[Prior] = []  # priors[i]: cell i's paired differences from the report it was carried from
    pending, carried, not_applicable = [], [], []  # the table names them instead of silently leaving them out
    earlier = previous.by_key() if previous else {}
    teacher_row = next((r for r in rows if r.kind == "teacher"), None)
    teacher_dir = comparison.cell_dir(teacher_row, budgets[0]) if teacher_row else None
    for budget, seed, row in grid(rows, budgets, seeds):
        cell = comparison.cell_dir(row, budget, seed) if row.kind != "teacher" else teacher_dir
        label = row.name + (f" (seed {seed})" if seed and row.kind != "teacher" else "")
        where = label + ("" if len(budgets) == 1 else f" (C={budget})")
        control = read_control(control_folder(comparison, row, budget, seed)) if row.kind == "control" else None
        if control is not None and control.control is None:  # the student has no such control
            not_applicable.append(f"{where} ({control.why})")
            continue
        found = read_cell(cell, tasks) if cell is not None and cell.is_dir() else None
        empty = found is None or not found.measured
        key = (row.name, budget, seed if row.kind != "teacher" else None)
        if empty and key in earlier:
            c, found_items, prior = _carry(earlier[key], tasks)
            cells.append(c)
            items.append(found_items)
            priors.append(prior)
            carried.append(where)
            continue
        if found is None:
            pending.append(where)
            continue
        if empty and row.kind != "teacher":  # a fit under way, or a control not measured yet: nothing to show
            pending.append(f"{where} ({fit_state(cell) if row.kind == 'student' else 'not measured yet'})")
            continue
        items.append(found.items)
        priors.append(None)
        cells.append(_measured_cell(row, budget, seed, label, found, cell, control and control.control, tasks))
    for budget, seed in ((b, s) for b in budgets for s in seeds):
        _compare_within(cells, items, priors, budget, seed, tasks, comparison.gap_floor)
    teacher = next((c for c in cells if c.kind == "teacher"), None)
    if teacher is not None:  # 1 by definition, wherever a gap is defined
        teacher.gap_closed = 1.0 if any(c.gap_closed is not None for c in cells if c is not teacher) else None
    report = Report(
        budgets=list(budgets),
        seeds=list(seeds),
        tasks=list(tasks),
        primary_metric=PRIMARY_METRIC,
        cells=cells,
        pending=pending,
        carried=carried,
        not_applicable=not_applicable,
        gap_floor=comparison.gap_floor,
    )
    report.seed_summary = seed_summary(report)
    return report


def _measured_cell(
    row: Row, budget: int, seed: int, label: str, found: CellFiles, folder: Path, control: Control | None, tasks
) -> Cell:
    """The report cell of what :func:`~lit_dof.comparison.artefacts.read_cell` found in ``folder``."""
    tuned = {p.stem: load_record(FinetuneScore, p) for p in sorted((folder / "finetune").glob("*.json"))}
    ppl = found.ppl
    return Cell(
        row=row.name,
        label=label,
        seed=seed if row.kind != "teacher" else None,
        note=_control_note(row.note, control),
        budget=budget,
        kind=row.kind,
        fit=found.fit,
        reference=row.reference if row.kind != "teacher" and row.reference != row.name else None,
        scores=found.scores,
        average=seven_task_average(found.scores, tasks),
        ppl=ppl and ppl.ppl,
        ppl_setting=ppl and ppl.setting,
        finetuned={task: record.score for task, record in tuned.items()},
        finetuned_before={task: r.zero_shot for task, r in tuned.items() if r.zero_shot is not None},
        by_position=ppl and ppl.by_position,
        long=found.long,
        state=ppl and ppl.state,
        control=control,
        long_documents=found.long_documents,
        retrieval=found.retrieval,
        devices=sorted(found.devices),
        items={t: encode_items(v) for t, v in found.items.items()},
    )


def _compare_within(
    cells: list[Cell],
    items: list[dict],
    priors: list[Prior],
    budget: int,
    seed: int,
    tasks: Sequence[str],
    floor: str | None,
) -> None:
    """Compare the cells of one budget and seed with each other: the gap closed between the ``floor`` row (this
    seed's, else another seed's; the paper's: Performer) and the teacher, and each cell's paired differences from its
    reference row (a carried cell keeps its earlier ones while its reference is carried too and nothing re-pairs more
    tasks)."""
    group = [
        (c, found, prior) for c, found, prior in zip(cells, items, priors) if c.budget == budget and c.seed == seed
    ]
    teacher = next((c for c in cells if c.kind == "teacher"), None)
    floor_cell = next((c for c, _, _ in group if c.row == floor), None) or next(
        (c for c in cells if c.row == floor and c.budget == budget), None
    )
    by_row = {c.row: found for c, found, _ in group}
    for c, found, prior in group:
        ok = teacher and floor_cell and None not in (c.average, teacher.average, floor_cell.average)
        gap = (teacher.average - floor_cell.average) if ok else None
        c.gap_closed = (c.average - floor_cell.average) / gap if ok and gap else None
        if c.reference in by_row:  # not for a reference itself, or one not measured (or not selected)
            pair_with_reference(c, found, by_row[c.reference], tasks)
        reference = next((r for r, _, _ in group if r.row == c.reference), None)
        if prior and reference is not None and reference.carried and len(c.vs_reference) < len(prior[0]):
            c.vs_reference = prior[0]  # same measurements, no items to re-pair
            c.vs_reference_average = prior[1] or c.vs_reference_average


def seven_task_average(scores: dict[str, TaskScore], tasks: Sequence[str]) -> float | None:
    """The mean primary metric over the report's zero-shot tasks (the seven, or those of them the report shows), when
    every one is scored; an extra task (5-shot MMLU) is shown beside it, not averaged.

    Args:
        scores: a cell's scores by task.
        tasks: the report's tasks.

    Returns:
        The average, or ``None``.
    """
    averaged = [t for t in tasks if t in TASKS]
    if not averaged or any(t not in scores for t in averaged):
        return None
    return mean_of(scores[t].value for t in averaged)


def _control_note(note: str, control: Control | None) -> str:
    """A control cell's note: what it is, with its window and its decode state beside its student's."""
    if not control:
        return note
    window = f"window {control.window} + {control.sink_tokens} sinks; " if control.window is not None else ""
    mib = 2**20
    return (
        f"{note} ({window}decode state {control.state_bytes / mib:.2f} MiB vs the student's "
        f"{control.student_state_bytes / mib:.2f} MiB at {control.context} tokens)"
    )
