"""The comparison report as types: :class:`Report`, its :class:`Cell` s and their parts, as ``comparison.json`` holds
them. :func:`~lit_dof.comparison.collect.collect` builds a report, the renderers (:mod:`~lit_dof.comparison.render`,
:mod:`~lit_dof.comparison.plots`, :mod:`~lit_dof.comparison.beyond_window`) read it. :meth:`Report.from_json` reads
every format a report has been written in (older ones are upgraded on load: cells without a ``reference``, a
``seed`` or a ``label``); parsing and dumping are pydantic's (a :class:`pydantic.TypeAdapter` over these standard
dataclasses), so a report read from disk is validated field by field and builds nothing but these types.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_dof.comparison.cell_records import FitSummary, RetrievalSummary, StateBytes, TaskScore
from lit_dof.evaluation.control_record import Control
from lit_dof.records import dump_record, parse_record

CellKey = tuple[str | None, int, int | None]
"""``(row, budget, seed)``: how the tables find a cell (the teacher's seed is ``None``)."""

LEGACY_GAP_FLOOR = "performer"
"""The gap floor of every report written before reports named theirs."""

LEGACY_REFERENCE = "fix"
"""The reference of every student cell recorded before rows named their own (``Row.reference``)."""


@dataclass
class PairedDifference:
    """A cell minus its reference on the same examples (:func:`~lit_dof.evaluation.stats.paired_difference`):
    ``difference`` ± ``stderr`` (fractions of the metric) over ``n`` examples (``None`` for an average over tasks)."""

    difference: float
    stderr: float
    n: int | None = None


@dataclass(kw_only=True)
class Cell:
    """One (row, budget, seed) of the grid: what was measured, each part ``None`` (or empty) until it is.

    Attributes:
        row, label, seed, note, budget, kind: the row, its name in tables (row and seed), the training seed
            (``None`` for the teacher), what it is, the feature budget C, and ``teacher``/``student``/``control``.
        fit: the fit's summary. reference: the row it is measured against (``None``: none).
        scores: per task. average: the seven zero-shot tasks' mean. ppl, ppl_setting: sliding-window perplexity and
            its setting. finetuned, finetuned_before: per task, the fine-tuned score and the untuned model's on the
            same documents. by_position, long, long_documents: the
            position records (:mod:`~lit_dof.evaluation.position_report`). state: the decode state. control: what a
            control is. retrieval: per task. devices: where it was measured. items: per task, the per-example
            scores (:func:`~lit_dof.comparison.collect.encode_items`).
        gap_closed, vs_reference, vs_reference_average: the comparisons within the budget and seed.
        carried: taken from an earlier report (no run directory now).
    """

    row: str
    label: str | None = None
    seed: int | None = None
    note: str = ""
    budget: int
    kind: str
    fit: FitSummary | None = None
    reference: str | None = None
    scores: dict[str, TaskScore] = field(default_factory=dict)
    average: float | None = None
    ppl: float | None = None
    ppl_setting: str | None = None
    finetuned: dict[str, float] = field(default_factory=dict)
    finetuned_before: dict[str, float] = field(default_factory=dict)
    by_position: dict[str, Any] | None = None
    long: dict[str, Any] | None = None
    state: StateBytes | None = None
    control: Control | None = None
    long_documents: dict[str, Any] | None = None
    retrieval: dict[str, RetrievalSummary] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    items: dict[str, str | list[float]] = field(default_factory=dict)
    gap_closed: float | None = None
    vs_reference: dict[str, PairedDifference | None] = field(default_factory=dict)
    vs_reference_average: PairedDifference | None = None
    carried: bool = False

    @property
    def name(self) -> str:
        """The cell's name in tables and legends: its label, else its row."""
        return self.label or self.row

    def key(self, row: str | None = None) -> CellKey:
        """``(row, budget, seed)`` of ``row`` (default: this cell's own) at this cell's budget and seed: the key by
        which the tables find a cell's reference."""
        return (row or self.row, self.budget, self.seed)

    @property
    def reference_key(self) -> CellKey | None:
        """The key of the reference row's cell at this budget and seed (``None``: no reference)."""
        return self.key(self.reference) if self.reference else None

    @property
    def document_buckets(self) -> dict[str, dict]:
        """The long-document test set's records by in-document position (``"2048-4095"``: tokens 2048 to 4095 of
        each document); empty when not measured."""
        return (self.long_documents or {}).get("buckets") or {}

    def bucket_ppl(self, bucket: str) -> float | None:
        """The long-document perplexity at in-document positions ``bucket``, or ``None``."""
        return (self.document_buckets.get(bucket) or {}).get("ppl")

    @classmethod
    def from_json(cls, data: dict) -> Cell:
        """A cell from its JSON form (:meth:`Report.from_json` upgrades older ones).

        Raises:
            pydantic.ValidationError: a field of the wrong type, or a required one missing (named in the message).
        """
        return parse_record(cls, data)


@dataclass
class Spread:
    """Mean, sample standard deviation (``None`` for one value) and count of some values over seeds; ``stderr`` =
    sd/√n where it is a comparison over seeds."""

    mean: float
    sd: float | None
    n: int
    stderr: float | None = None


@dataclass
class SeedSummary:
    """One (row, budget) over two or more seeds (:func:`~lit_dof.comparison.summary.seed_summary`): the seven-task
    average and the perplexity over seeds; per seed and over seeds, the average paired difference from the reference
    row and the perplexity ratio to it."""

    row: str
    budget: int
    seeds: list[int]
    reference: str | None
    average: Spread | None
    ppl: Spread | None
    vs_reference_per_seed: dict[int, float]
    vs_reference: Spread | None
    ppl_ratio_per_seed: dict[int, float]
    ppl_ratio: Spread | None


@dataclass(kw_only=True)
class Report:
    """A comparison report, ``comparison.json``: its budgets, seeds, tasks (with their primary metric), cells, the
    cells not measured yet (``pending``), carried from an earlier report, or not applicable (a control the student
    does not have, with the reason), the summary over seeds, and the row its "gap closed" is measured from."""

    budgets: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    tasks: list[str] = field(default_factory=list)
    primary_metric: dict[str, str] = field(default_factory=dict)
    cells: list[Cell]
    pending: list[str] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    seed_summary: list[SeedSummary] = field(default_factory=list)
    gap_floor: str | None = None

    @property
    def has_scores(self) -> bool:
        """Whether any cell has task scores (else a perplexity-only study such as the λ study)."""
        return any(c.scores for c in self.cells)

    def by_key(self) -> dict[CellKey, Cell]:
        """The cells by :meth:`Cell.key`."""
        return {c.key(): c for c in self.cells}

    @property
    def teacher(self) -> Cell | None:
        """The teacher's cell, if the report has one."""
        return next((c for c in self.cells if c.kind == "teacher"), None)

    def reference_curve(self, cell: Cell) -> dict[int, float]:
        """The validation curve ``cell``'s is divided by: its reference row's at the same budget and seed (a cell
        without a reference is its own, ratio 1); empty when that cell has none."""
        key = cell.key(cell.reference)
        other = next((c for c in self.cells if c.key() == key), None)  # one cell's curve, not every cell's
        return dict(other.fit.val_curve) if other and other.fit else {}

    @classmethod
    def from_json(cls, data: dict) -> Report:
        """A report from its JSON form, older formats upgraded: a cell recorded before rows named their reference was
        measured against Fix (a student cell other than Fix gets ``"fix"``), a hand-made cell without a seed is seed
        0 (the teacher's is ``None``), and a report without ``gap_floor`` measured its gap from Performer.

        Raises:
            ValueError: ``data`` is not a JSON object. pydantic.ValidationError (a ``ValueError``): a field of the
                wrong type, or a required one missing (named in the message).
        """
        if not isinstance(data, dict):
            raise ValueError(f"a report is a JSON object, not a {type(data).__name__}")
        data = {"gap_floor": LEGACY_GAP_FLOOR, **data}
        cells = data.get("cells")
        return parse_record(cls, {**data, "cells": [_upgraded(c) for c in cells] if isinstance(cells, list) else cells})

    def to_json(self) -> dict:
        """The report as JSON-ready containers (integer keys as strings), in field order."""
        return dump_record(self)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Report:
        """Read ``path`` (:meth:`from_json`).

        Raises:
            FileNotFoundError: no such file. ValueError: not JSON, or not a report (:meth:`from_json`).
        """
        return cls.from_json(json.loads(Path(path).read_text()))


def _upgraded(cell: dict) -> dict:
    """A cell of any earlier format in today's (see :meth:`Report.from_json`)."""
    if not isinstance(cell, dict):
        return cell  # pydantic names the error
    student = cell.get("kind") == "student"
    legacy = {
        "reference": LEGACY_REFERENCE if student and cell.get("row") != LEGACY_REFERENCE else None,
        "seed": None if cell.get("kind") == "teacher" else 0,
    }
    return {**{k: v for k, v in legacy.items() if k not in cell}, **cell}
