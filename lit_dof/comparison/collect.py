"""Gathering the report: every finished cell of the grid, the cells carried over from an earlier
``comparison.json``, and the comparisons between cells of one budget and seed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lit_dof.comparison.artefacts import fit_state, read_cell
from lit_dof.comparison.control_cells import control_folder, read_control
from lit_dof.comparison.lookup import with_references
from lit_dof.comparison.rows import PRIMARY_METRIC, ROWS, Row, grid
from lit_dof.comparison.summary import mean_of, pair_with_reference, seed_summary
from lit_dof.evaluation.task_data import TASKS

if TYPE_CHECKING:
    from lit_dof.comparison.cells import Comparison


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


def _carry(previous: dict, tasks: Sequence[str]) -> tuple[dict, dict]:
    """A cell of an earlier report, as :func:`collect` builds one: scores and per-example items restricted to
    ``tasks``, average recomputed, the comparisons (gap closed, paired differences) recomputed by the caller;
    its earlier paired differences kept under ``prior_vs_reference`` for cells stored without items."""
    c = {k: v for k, v in previous.items() if k not in ("items", "gap_closed", "vs_reference", "vs_reference_average")}
    c["scores"] = {t: s for t, s in (previous.get("scores") or {}).items() if t in tasks}
    c["average"] = seven_task_average(c["scores"], tasks)
    c["carried"] = True
    if previous.get("vs_reference"):
        c["prior_vs_reference"] = {k: previous.get(k) for k in ("vs_reference", "vs_reference_average")}
    items = {t: decode_items(v) for t, v in (previous.get("items") or {}).items() if t in tasks}
    if items:  # kept in the record too, so that the next rewrite can pair (and carry) them again
        c["items"] = {t: encode_items(v) for t, v in items.items()}
    return c, items


def collect(
    comparison: Comparison,
    rows: Sequence[Row],
    budgets: Sequence[int],
    tasks: Sequence[str] = TASKS,
    seeds: Sequence[int] = (0,),
    previous: dict | None = None,
) -> dict:
    """Every finished part of every cell (missing parts are ``None``); ``pending`` names the selected rows with
    no cell yet or with a fit still under way (nothing to show). Cells of one budget and seed are compared
    with each other (gap closed, paired differences); ``seed_summary`` (:func:`seed_summary`) pools the seeds.

    ``previous``: an earlier ``comparison.json`` (the report is the durable record; run directories hold
    checkpoints and may be scratch space). A selected cell with nothing under ``comparison.out`` is taken
    whole from it, marked ``carried`` and listed in ``report["carried"]``; a cell found under ``out`` always
    wins. Each cell keeps its per-example scores (``items``, :func:`encode_items`) so that a carried cell is
    still paired with a re-measured one; a cell from a report written before items were kept keeps its
    earlier paired difference only while its reference row is carried too (the same measurements).

    Args:
        comparison: where the cells are (:class:`~lit_dof.comparison.cells.Comparison`).
        rows: the selected rows.
        budgets: feature budgets C.
        tasks: the report's tasks.
        seeds: training seeds.
        previous: an earlier ``comparison.json`` to carry cells from (``None``: none).

    Returns:
        The report: ``budgets``, ``seeds``, ``tasks``, ``primary_metric``, ``cells``, ``pending``, ``carried``,
        ``not_applicable`` (control rows whose student has no such control, with the reason), ``seed_summary``.
    """
    cells, items = [], []  # items[i][task]: cell i's per-example scores of the task's primary metric
    pending, carried, not_applicable = [], [], []  # the table names them instead of silently leaving them out
    earlier = {(c["row"], c["budget"], c.get("seed")): c for c in with_references(previous or {}).get("cells", [])}
    teacher_dir = comparison.cell_dir(ROWS["teacher"], budgets[0]) if "teacher" in [r.name for r in rows] else None
    for budget, seed, row in grid(rows, budgets, seeds):
        cell = comparison.cell_dir(row, budget, seed) if row.kind != "teacher" else teacher_dir
        label = row.name + (f" (seed {seed})" if seed and row.kind != "teacher" else "")
        where = label + ("" if len(budgets) == 1 else f" (C={budget})")
        control = read_control(control_folder(comparison, row, budget, seed)) if row.kind == "control" else None
        if control is not None and control["control"] is None:  # the student has no such control
            not_applicable.append(f"{where} ({control['why']})")
            continue
        found = read_cell(cell, tasks) if cell is not None and cell.is_dir() else None
        measured = ("fit", "ppl", "long", "long_documents", "scores", "retrieval")
        empty = found is None or not any(found[k] for k in measured)
        key = (row.name, budget, seed if row.kind != "teacher" else None)
        if empty and key in earlier:
            c, found_items = _carry(earlier[key], tasks)
            cells.append(c)
            items.append(found_items)
            carried.append(where)
            continue
        if found is None:
            pending.append(where)
            continue
        if empty and row.kind != "teacher":  # a fit under way, or a control not measured yet: nothing to show
            pending.append(f"{where} ({fit_state(cell) if row.kind == 'student' else 'not measured yet'})")
            continue
        items.append(found["items"])
        finetuned = {p.stem: json.loads(p.read_text())["score"] for p in sorted((cell / "finetune").glob("*.json"))}
        scores, ppl, what = found["scores"], found["ppl"], (control or {}).get("control")
        cells.append(
            {
                "row": row.name,
                "label": label,
                "seed": seed if row.kind != "teacher" else None,
                "note": _control_note(row.note, what),
                "budget": budget,
                "kind": row.kind,
                "fit": found["fit"],
                "reference": row.reference if row.kind != "teacher" and row.reference != row.name else None,
                "scores": scores,
                "average": seven_task_average(scores, tasks),
                "ppl": ppl["ppl"] if ppl else None,
                "ppl_setting": _ppl_setting(ppl),
                "finetuned": finetuned,
                "by_position": (ppl or {}).get("by_position"),
                "long": (found["long"] or {}).get("contexts"),
                "state": (ppl or {}).get("state"),
                "control": what,
                "long_documents": found["long_documents"],
                "retrieval": found["retrieval"],
                "devices": sorted(d for d in found["devices"] if d),
                "items": {t: encode_items(v) for t, v in found["items"].items()},
            }
        )
    teacher = next((c for c in cells if c["kind"] == "teacher"), None)
    for budget, seed in ((b, s) for b in budgets for s in seeds):
        group = [(c, found) for c, found in zip(cells, items) if c["budget"] == budget and c["seed"] == seed]
        performer = next((c for c, _ in group if c["row"] == "performer"), None) or next(  # this seed's floor,
            (c for c in cells if c["row"] == "performer" and c["budget"] == budget), None
        )  # else another seed's
        by_row = {c["row"]: found for c, found in group}
        for c, found in group:
            ok = teacher and performer and None not in (c["average"], teacher["average"], performer["average"])
            gap = (teacher["average"] - performer["average"]) if ok else None
            c["gap_closed"] = (c["average"] - performer["average"]) / gap if ok and gap else None
            if c["reference"] in by_row:  # not for a reference itself, or one not measured (or not selected)
                pair_with_reference(c, found, by_row[c["reference"]], tasks)
            prior = c.pop("prior_vs_reference", None)
            reference = next((r for r, _ in group if r["row"] == c["reference"]), None)
            if (
                prior
                and reference is not None
                and reference.get("carried")
                and len(c.get("vs_reference") or {}) < len(prior.get("vs_reference") or {})
            ):
                c.update({k: v for k, v in prior.items() if v is not None})  # same measurements, no items to re-pair
    if teacher is not None:  # 1 by definition, wherever a gap is defined
        teacher["gap_closed"] = 1.0 if any(c.get("gap_closed") is not None for c in cells if c is not teacher) else None
    report = {
        "budgets": list(budgets),
        "seeds": list(seeds),
        "tasks": list(tasks),
        "primary_metric": PRIMARY_METRIC,
        "cells": cells,
        "pending": pending,
        "carried": carried,
        "not_applicable": not_applicable,
    }
    report["seed_summary"] = seed_summary(report)
    return report


def seven_task_average(scores: dict, tasks: Sequence[str]) -> float | None:
    """The mean primary metric over the report's zero-shot tasks (the seven, or those of them the report shows), when
    every one is scored; an extra task (5-shot MMLU) is shown beside it, not averaged.

    Args:
        scores: a cell's ``{task: {"value", ...}}``.
        tasks: the report's tasks.

    Returns:
        The average, or ``None``.
    """
    averaged = [t for t in tasks if t in TASKS]
    if not averaged or any(t not in scores for t in averaged):
        return None
    return mean_of(scores[t]["value"] for t in averaged)


def _ppl_setting(ppl: dict | None) -> str | None:
    if not ppl:
        return None
    split = f", {ppl['split']} split" if ppl.get("split") else ""  # records before the test split: validation, unsaid
    return f"{ppl['tokens']} tokens, window {ppl['window']}, stride {ppl['stride']}{split}"


def _control_note(note: str, control: dict | None) -> str:
    """A control cell's note: what it is, with its window and its decode state beside its student's."""
    if not control:
        return note
    window = f"window {control['window']} + {control['sink_tokens']} sinks; " if control["window"] is not None else ""
    mib = 2**20
    return (
        f"{note} ({window}decode state {control['state_bytes'] / mib:.2f} MiB vs the student's "
        f"{control['student_state_bytes'] / mib:.2f} MiB at {control['context']} tokens)"
    )
