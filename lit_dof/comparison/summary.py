"""Statistics of the report: means over what was measured, paired differences from the reference row, and
the spread of each method over training seeds."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from lit_dof.comparison.records import Cell, PairedDifference, Report, SeedSummary, Spread
from lit_dof.evaluation.stats import paired_task_differences
from lit_dof.evaluation.task_data import TASKS


def mean_of(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not ``None``; ``None`` when there are none.

    Args:
        values: numbers or ``None``.

    Returns:
        Their mean, or ``None``.
    """
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def pair_with_reference(c: Cell, items: dict, reference: dict, tasks: Sequence[str]) -> None:
    """Set ``c.vs_reference`` (per task, the paired difference of the per-example scores ± its standard
    error) and, with every one of the seven zero-shot tasks paired, ``c.vs_reference_average`` over them (tasks
    are disjoint example sets: SE √(Σ SE²) / n; an extra task such as 5-shot MMLU is paired but not averaged), as
    :func:`~lit_dof.evaluation.stats.paired_task_differences` computes them.

    Args:
        c: the report cell to update.
        items: its per-example scores by task.
        reference: the reference cell's per-example scores by task.
        tasks: the report's tasks.
    """
    per_task, _ = paired_task_differences(items, reference, tasks)
    c.vs_reference = {t: PairedDifference(**d) if d else None for t, d in per_task.items()}
    _, average = paired_task_differences(items, reference, [t for t in tasks if t in TASKS])  # the seven's average
    if average is not None:
        c.vs_reference_average = PairedDifference(**average)


def spread_of(values: Sequence[float | None]) -> Spread | None:
    """Mean, sample standard deviation (``None`` for one value) and count of ``values``; ``None`` if empty.

    Args:
        values: numbers (``None`` values are skipped).

    Returns:
        The spread, or ``None``.
    """
    values = [v for v in values if v is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return Spread(mean, sd, len(values))


def _over_seeds(per_seed: dict) -> Spread | None:
    """:func:`spread_of` of per-seed values, with the standard error over seeds ``stderr`` = sd/√n (2+ seeds)."""
    spread = spread_of(list(per_seed.values()))
    if spread and spread.sd is not None:
        spread.stderr = spread.sd / math.sqrt(spread.n)
    return spread


def seed_summary(report: Report) -> list[SeedSummary]:
    """Per (row, budget) trained with two or more seeds: the seven-task average and the perplexity over the
    seeds (mean, standard deviation); per seed, the average paired difference from the reference row (same
    budget and seed) and the perplexity ratio to it, and both over the seeds: mean ± standard error sd/√n.
    That standard error measures what one run's paired SE cannot — the spread of training itself (random
    features, the DoF sample).

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        One entry per (row, budget) with two or more seeds.
    """
    groups: dict[tuple[str, int], list[Cell]] = {}
    for c in report.cells:
        if c.kind != "teacher":
            groups.setdefault((c.row, c.budget), []).append(c)
    by_cell = report.by_key()
    summary = []
    for (row, budget), group in groups.items():
        if len({c.seed for c in group}) < 2:
            continue
        differences, ratios = {}, {}
        for c in group:
            reference = by_cell.get(c.reference_key)
            if c.vs_reference_average:
                differences[c.seed] = c.vs_reference_average.difference
            if reference and c.ppl is not None and reference.ppl:
                ratios[c.seed] = c.ppl / reference.ppl
        summary.append(
            SeedSummary(
                row=row,
                budget=budget,
                seeds=[c.seed for c in group],
                reference=group[0].reference,
                average=spread_of([c.average for c in group]),
                ppl=spread_of([c.ppl for c in group]),
                vs_reference_per_seed=differences,
                vs_reference=_over_seeds(differences),
                ppl_ratio_per_seed=ratios,
                ppl_ratio=_over_seeds(ratios),
            )
        )
    return summary
