"""The report's sections on what lies beyond a student's exact window: the long-document test set by in-document
position, retrieval by context, and — the runs being the unit — each student against its reference and its controls
over seeds (mean of the per-seed paired comparisons ± its standard error over seeds, 95% t interval), on perplexity
and retrieval and, in a table of their own, on the tasks.

A pair is (student, other): a student row with its reference row (e.g. the quickstart and the untrained
window-plus-sink control ``swa_sink``), and a student with each of its control rows (``<row>:<control>``), so
that every ratio reads "student / other" and every difference "student − other".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lit_dof.comparison.cell_records import RetrievalSummary
from lit_dof.comparison.records import Cell, Report
from lit_dof.evaluation.stats import paired_difference, paired_seed_difference


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def beyond_exact_lines(report: Report) -> list[str]:
    """The share of each task's examples longer than a cell's exact positions (window + sinks): the only examples
    on which a window + sinks student, or a control behind a window, can score differently from its teacher; empty
    when no cell records it.

    Args:
        report: a report.

    Returns:
        The lines.
    """
    cells = [c for c in report.cells if any(s.beyond_exact is not None for s in c.scores.values())]
    if not cells:
        return []
    tasks = [t for t in report.tasks if any(_beyond_exact(c, t) is not None for c in cells)]
    title = (
        "Examples beyond the exact window (the share of each task's examples longer than the model's window + sinks: "
        "the only ones on which it can score differently from its teacher):"
    )
    lines = ["", title, "", "| model | " + " | ".join(tasks) + " |", "|" + "---|" * (len(tasks) + 1)]
    for c in cells:
        lines.append(f"| {c.name} | " + " | ".join(_pct(_beyond_exact(c, t)) for t in tasks) + " |")
    return lines


def _beyond_exact(c: Cell, task: str) -> float | None:
    score = c.scores.get(task)
    return score.beyond_exact if score else None


def retrieval_lines(report: Report) -> list[str]:
    """The "Retrieval" section: per task, each cell's exact match overall (± SE over examples) and by context
    (mean over needle depths), the share of needles beyond its window, and its paired difference from its reference
    on the same examples; empty when no cell has a retrieval record.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The lines.
    """
    cells = [c for c in report.cells if c.retrieval]
    if not cells:
        return []
    by_key = {c.key(): c for c in cells}
    title = (
        "Retrieval (greedy generation, exact match; by context: mean over needle depths; beyond: needles outside the "
        "model's exact window; − reference: paired over the same examples, ± SE):"
    )
    lines = ["", title]
    for task in sorted({t for c in cells for t in c.retrieval}):
        shown = [c for c in cells if task in c.retrieval]
        contexts = sorted({k for c in shown for k in c.retrieval[task].cells or {}})
        columns = ["model", "all", *(f"{k} tokens" for k in contexts), "beyond", "− reference"]
        lines += ["", f"`{task}`:", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for c in shown:
            entry = c.retrieval[task]
            means = [_pct(entry.by_context(k)) for k in contexts]
            reference = by_key.get(c.reference_key)
            overall = f"{_pct(entry.exact_match)} ± {_pct(entry.exact_match_stderr)} (n={entry.n})"
            paired = _paired_text(entry, reference.retrieval.get(task) if reference else None)
            cells_text = [c.name, overall, *means, _pct(entry.beyond_window), paired]
            lines.append("| " + " | ".join(cells_text) + " |")
    return lines


def _paired_text(entry: RetrievalSummary, reference: RetrievalSummary | None) -> str:
    """``difference ± SE`` in points over the same examples, or ``–``."""
    if not reference or not entry.items or len(entry.items) != len(reference.items or []):
        return "–"
    difference, stderr, _ = paired_difference(entry.items, reference.items)
    return f"{100 * difference:+.0f} ± {100 * stderr:.0f}"


@dataclass
class SeedPair:
    """A student against another model (its reference, or one of its controls: ``controlled``) at budget C, over the
    ``seeds`` both were measured with: per measure, :func:`~lit_dof.evaluation.stats.paired_seed_difference`'s
    result (``None``: fewer than two seeds measured on both sides) — the sliding-window ``ppl`` ratio, the ratio in
    each long-document bucket, the exact-match difference of each retrieval task and the primary-metric difference
    of each task (``tasks``, fractions: 0.01 is a point)."""

    student: str
    other: str
    budget: int
    seeds: list[int]
    controlled: bool
    ppl: dict | None
    long_documents: dict[str, dict | None]
    retrieval: dict[str, dict | None]
    tasks: dict[str, dict | None]


def seed_pairs(report: Report) -> list[SeedPair]:
    """Each student against its reference and each of its controls, over the seeds both were measured with.

    Args:
        report: a report.

    Returns:
        One :class:`SeedPair` per (student, other, budget) with two or more seeds in common; perplexities compared
        as ratios (:func:`~lit_dof.evaluation.stats.paired_seed_difference` with ``log``), exact match as
        differences.
    """
    cells = report.by_key()
    pairs: dict[tuple, list[tuple[int, Cell, Cell]]] = {}
    for c in report.cells:
        other = cells.get(c.reference_key)
        if other is None or c.kind == "teacher":
            continue
        student, against = (other, c) if c.kind == "control" else (c, other)
        pairs.setdefault((student.row, against.row, c.budget), []).append((c.seed or 0, student, against))
    out = []
    for (student, other, budget), runs in pairs.items():
        if len({seed for seed, _, _ in runs}) < 2:
            continue
        buckets = {b for _, s, _ in runs for b in s.document_buckets}
        tasks = {t for _, s, _ in runs for t in s.retrieval}
        scored = [t for t in report.tasks if any(t in s.scores for _, s, _ in runs)]
        out.append(
            SeedPair(
                student,
                other,
                budget,
                sorted(seed for seed, _, _ in runs),
                controlled=runs[0][2].kind == "control",
                ppl=_compare(runs, lambda c: c.ppl, log=True),
                long_documents={
                    b: _compare(runs, lambda c, b=b: c.bucket_ppl(b), log=True)
                    for b in sorted(buckets, key=_bucket_start)
                },
                retrieval={t: _compare(runs, lambda c, t=t: _exact_match(c, t)) for t in sorted(tasks)},
                tasks={t: _compare(runs, lambda c, t=t: _score(c, t)) for t in scored},
            )
        )
    return out


def _bucket_start(bucket: str) -> int:
    return int(bucket.split("-")[0])


def _exact_match(c: Cell, task: str) -> float | None:
    entry = c.retrieval.get(task)
    return entry.exact_match if entry else None


def _score(c: Cell, task: str) -> float | None:
    score = c.scores.get(task)
    return score.value if score else None


def _compare(runs: list[tuple[int, Cell, Cell]], measure, log: bool = False) -> dict | None:
    """:func:`paired_seed_difference` of ``measure`` over the runs where both sides have it (``None`` under 2)."""
    both = {seed: (measure(s), measure(o)) for seed, s, o in runs}
    both = {seed: values for seed, values in both.items() if None not in values}
    if len(both) < 2:
        return None
    return paired_seed_difference({k: v[0] for k, v in both.items()}, {k: v[1] for k, v in both.items()}, log=log)


def seed_pair_lines(report: Report) -> list[str]:
    """The "Over seeds" section of :func:`seed_pairs`: student / other perplexity ratios (sliding window and each
    long-document bucket) and student − other retrieval exact match, each the mean over seeds ± SE [95% interval];
    only pairs with a control or with long-document or retrieval records (the seed table has the others), and
    empty when no pair has two seeds.

    Args:
        report: a report.

    Returns:
        The lines.
    """
    pairs = [p for p in seed_pairs(report) if _beyond_the_seed_table(p)]
    if not pairs:
        return []
    buckets = sorted({b for p in pairs for b in p.long_documents}, key=_bucket_start)
    tasks = sorted({t for p in pairs for t in p.retrieval})
    columns = ["student", "other", "C", "seeds", "ppl ratio", *(f"long docs {b}" for b in buckets)]
    columns += [f"{t} − other" for t in tasks]
    title = (
        "Each student against its reference and its controls over seeds (the runs are the unit: per seed the student "
        "and the other model, then the mean over seeds ± its standard error [95% t interval]; perplexity: "
        "geometric-mean ratio student / other; retrieval: exact-match difference in points):"
    )
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for p in pairs:
        cells = [p.student, p.other, str(p.budget), ", ".join(map(str, p.seeds)), _ratio(p.ppl)]
        cells += [_ratio(p.long_documents.get(b)) for b in buckets]
        cells += [_points(p.retrieval.get(t)) for t in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def seed_task_lines(report: Report) -> list[str]:
    """The "Tasks" section of :func:`seed_pairs`: per task, student − other in points of the task's
    primary metric (each seed's pair scored on the same examples), the mean over seeds ± SE [95% t interval]; only
    pairs with a control (the seed table has the reference's seven-task average), empty when none has two seeds.

    Args:
        report: a report.

    Returns:
        The lines.
    """
    pairs = [p for p in seed_pairs(report) if p.controlled and any(p.tasks.values())]
    if not pairs:
        return []
    tasks = [t for t in report.tasks if any(p.tasks.get(t) for p in pairs)]
    columns = ["student", "other", "C", "seeds", *(f"{t} − other" for t in tasks)]
    title = (
        "Tasks: each student against its controls over seeds (per seed the student's primary metric minus the "
        "other's on the same examples, in points; then the mean over seeds ± its standard error [95% t interval]):"
    )
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for p in pairs:
        cells = [p.student, p.other, str(p.budget), ", ".join(map(str, p.seeds))]
        lines.append("| " + " | ".join(cells + [_points(p.tasks.get(t)) for t in tasks]) + " |")
    return lines


def _beyond_the_seed_table(pair: SeedPair) -> bool:
    """Whether a pair says more than the seed table's perplexity ratio: a control, long documents or retrieval."""
    return pair.controlled or any(pair.long_documents.values()) or any(pair.retrieval.values())


def _ratio(result: dict | None) -> str:
    if not result:
        return "–"
    low, high = (math.exp(x) for x in result["ci95"])
    return f"{result['ratio']:.3f} ± {result['ratio'] * result['stderr']:.3f} [{low:.3f}, {high:.3f}] (n={result['n']})"


def _points(result: dict | None) -> str:
    if not result:
        return "–"
    low, high = (100 * x for x in result["ci95"])
    return (
        f"{100 * result['difference']:+.0f} ± {100 * result['stderr']:.0f} [{low:+.0f}, {high:+.0f}] (n={result['n']})"
    )
