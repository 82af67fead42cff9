"""How the report's tables and figure name and find its cells: a cell's key and label, its reference row's
cell, and the validation curves."""

from __future__ import annotations


def cell_key(row: str | None, c: dict) -> tuple[str | None, int, int | None]:
    """``(row, budget, seed)``: the cell of ``row`` at ``c``'s budget and seed, the key by which the tables find
    a cell's reference (``row``: ``c``'s own row or its reference; a hand-built cell without a seed is seed 0).

    Args:
        row: a row name (``None`` for a cell without reference).
        c: a report cell.

    Returns:
        The key.
    """
    return row, c["budget"], c.get("seed", 0)


def cell_label(c: dict) -> str:
    """A cell's name in tables and legends: its row, and its seed when not 0.

    Args:
        c: a report cell.

    Returns:
        Its label.
    """
    return c.get("label") or c["row"]


def validation_curves(report: dict) -> dict[tuple[str, int, int | None], dict[int, float]]:
    """``{(row, budget, seed): {step: validation perplexity}}`` of every cell with a validation curve.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The curves by cell key.
    """
    return {
        cell_key(c["row"], c): dict(c["fit"]["val_curve"]) for c in report["cells"] if (c["fit"] or {}).get("val_curve")
    }


def reference_curve(c: dict, curves: dict) -> dict[int, float]:
    """The validation curve ``c`` is divided by: its reference row's at the same budget and seed (a reference
    row is its own, ratio 1); empty when that cell has none.

    Args:
        c: a report cell.
        curves: :func:`validation_curves` of the report.

    Returns:
        ``{step: validation perplexity}``.
    """
    return curves.get(cell_key(c.get("reference") or c["row"], c), {})


LEGACY_REFERENCE = "fix"
"""The reference of every student cell recorded before rows named their own (``Row.reference``)."""


def with_references(report: dict) -> dict:
    """``report`` with every cell's ``reference`` set: cells recorded before references existed (no
    ``reference`` key) were all measured against Fix, so a student cell other than Fix gets ``"fix"``, any
    other cell ``None``. Cells that have the key are unchanged; ``report`` itself is not modified.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`), possibly an old ``comparison.json``.

    Returns:
        A shallow copy whose ``cells`` all carry ``reference``.
    """

    def legacy(c: dict) -> str | None:
        return LEGACY_REFERENCE if c.get("kind") == "student" and c["row"] != LEGACY_REFERENCE else None

    cells = [c if "reference" in c else {**c, "reference": legacy(c)} for c in report.get("cells", [])]
    return {**report, "cells": cells}


def has_scores(report: dict) -> bool:
    """Whether any cell has task scores (else a perplexity-only study such as the λ study).

    Args:
        report: a report.

    Returns:
        ``True`` when some cell has task scores.
    """
    return any(c["scores"] for c in report["cells"])
