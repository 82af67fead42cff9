"""The report as markdown: the Table-3-shaped table of :func:`~lit_dof.comparison.collect.collect`'s report and
its sections (fine-tuning, paired differences, seeds, validation curves, perplexity by position, devices)."""

from __future__ import annotations

import math

from lit_dof.comparison.beyond_window import beyond_exact_lines, retrieval_lines, seed_pair_lines, seed_task_lines
from lit_dof.comparison.cell_records import FitSummary, StateBytes
from lit_dof.comparison.records import Cell, Report, Spread
from lit_dof.comparison.summary import mean_of
from lit_dof.evaluation.task_data import TASKS


def _fmt(value, digits=3):
    return "–" if value is None else f"{value:.{digits}f}"


def _tuned(cell, task: str) -> str:
    """A fine-tuned score with the untuned model's on the same documents in brackets (when measured)."""
    before = cell.finetuned_before.get(task)
    return _fmt(cell.finetuned.get(task)) + (f" ({before:.3f})" if before is not None else "")


def _fmt_tokens(tokens) -> str:
    """A token count in the largest unit that keeps it above 1 (``1.64M``, ``1.0k``, ``512``); "–" when unknown."""
    if not tokens:
        return "–"
    if tokens >= 1e6:
        return f"{tokens / 1e6:.2f}M"
    return f"{tokens / 1e3:.1f}k" if tokens >= 1e3 else str(int(tokens))


def _fmt_total(total: float | None) -> str:
    """Σ M: an integer as is; a per-head allocation's sum of per-layer means to one decimal; "–" when unknown."""
    if total is None:
        return "–"
    return str(int(total)) if float(total).is_integer() else f"{total:.1f}"


def _fmt_bytes(state: StateBytes | None) -> str:
    """A cell's decoding state in MiB at its context; "–" when not measured."""
    return "–" if not state else f"{state.bytes / 2**20:.2f} MiB @ {state.context}"


def _fmt_lambda(fit: FitSummary) -> str:
    """The DoF estimate's λ as a power of two, with its rule and what it is relative to; "–" without one."""
    if not fit.uses_dof or fit.lam is None:
        return "–"
    text = f"2^{math.log2(fit.lam):.1f}" + (" (auto)" if fit.lam_rule == "auto" else "")
    if fit.relative_to:
        text += " · tr(G)/J" if fit.relative_to == "trace" else f" · {fit.relative_to}(G)"
    return text


def markdown(report: Report, header: str = "") -> str:
    """The Table-3-shaped markdown of :func:`collect`'s report.

    Args:
        report: :func:`~lit_dof.comparison.collect.collect`'s report.
        header: a first line (e.g. a title); none when empty.

    Returns:
        The markdown text.
    """
    tasks = report.tasks
    scored = report.has_scores  # a perplexity-only study (the λ study) drops the task columns
    lines = [header] if header else []
    columns = [
        "method",
        *(tasks + ["avg", "gap closed"] if scored else []),
        "ppl",
        "C",
        "Σ M",
        "state",
        "λ",
        "J",
        "tokens",
        "fit wall",
        "note",
    ]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for c in report.cells:
        fit = c.fit or FitSummary()
        wall = fit.wall_seconds
        scores = [*[_fmt(_score(c, t)) for t in tasks], _fmt(c.average), _fmt(c.gap_closed, 2)] if scored else []
        row = [
            c.name,
            *scores,
            _fmt(c.ppl, 1),
            str(c.budget) if c.kind != "teacher" else "–",
            _fmt_total(fit.total_features),
            _fmt_bytes(c.state),
            _fmt_lambda(fit),
            str(fit.num_samples or "–") if fit.uses_dof else "–",
            _fmt_tokens(fit.tokens),
            f"{wall / 60:.0f} min" if wall else "–",
            c.note,
        ]
        lines.append("| " + " | ".join(row) + " |")
    if report.pending:
        lines += ["", "Not measured yet (re-running the command resumes here): " + ", ".join(report.pending) + "."]
    if report.not_applicable:
        lines += ["", "Controls the students do not have: " + ", ".join(report.not_applicable) + "."]
    if report.carried:
        lines += [
            "",
            "Carried from this folder's earlier comparison.json (no run directory of theirs under the "
            "output folder now; their records are unchanged): " + ", ".join(report.carried) + ".",
        ]
    finetuned_tasks = sorted({t for c in report.cells for t in c.finetuned})
    if finetuned_tasks:
        lines += [
            "",
            (
                "Fine-tuned per task (METHOD.md §4; accuracy on the report split at the epoch best on the choosing "
                "split, MMLU: the last; learning rate chosen on the teacher's choosing split from its grid; in "
                "brackets the same model untuned on the same documents):"
            ),
            "",
            "| method | " + " | ".join(finetuned_tasks) + " |",
            "|" + "---|" * (len(finetuned_tasks) + 1),
        ]
        for c in report.cells:
            if c.finetuned:
                scores = [_tuned(c, t) for t in finetuned_tasks]
                lines.append(f"| {c.name} | " + " | ".join(scores) + " |")
    lines += beyond_exact_lines(report)
    lines += paired_table(report)
    lines += seed_table(report)
    lines += curve_table(report)
    lines += _position_sections(report)
    lines += retrieval_lines(report)
    lines += seed_pair_lines(report)
    lines += seed_task_lines(report)
    lines += ["", _device_note(report), ""]
    extra = [t for t in tasks if t not in TASKS]  # shown, not averaged
    lines.append(
        "Metrics: "
        + ", ".join(f"{t} {m}" for t, m in report.primary_metric.items() if t in tasks)
        + (". avg: the seven zero-shot tasks (not " + ", ".join(extra) + ")" if extra else "")
        + _gap_note(report.gap_floor)
        + ". ppl: sliding-window "
        "perplexity on held-out Wikipedia documents" + _ppl_note(report) + "."
    )
    return "\n".join(lines)


def _gap_note(floor: str | None) -> str:
    """The footnote's definition of the "gap closed" column (none without a floor row)."""
    if floor is None:
        return ""
    name = "Performer" if floor == "performer" else f"`{floor}`"
    return f". gap closed = (avg − {name} avg) / (teacher avg − {name} avg)"


def _score(c: Cell, task: str) -> float | None:
    """``c``'s primary metric on ``task`` (``None``: not scored)."""
    score = c.scores.get(task)
    return score.value if score else None


def _position_sections(report: Report) -> list[str]:
    """Perplexity by position and at long contexts (:mod:`~lit_dof.evaluation.position_report`), each cell paired
    with the teacher and with its reference row of the same budget and seed."""
    from lit_dof.evaluation.position_report import long_context_lines, long_document_lines, position_lines

    cells = report.by_key()
    teacher = report.teacher.name if report.teacher else None
    models = [
        {
            "label": c.name,
            "by_position": c.by_position,
            "long": c.long,
            "long_documents": c.long_documents,
            "reference": cells[c.reference_key].name if c.reference_key in cells else None,
        }
        for c in report.cells
    ]
    lines = position_lines(models, teacher) + long_context_lines(models, teacher)
    return lines + long_document_lines(models, teacher)


def _device_note(report: Report) -> str:
    """Where the cells were measured (fits, perplexity, evaluations): one device for all, or per cell."""
    several = len({c.budget for c in report.cells}) > 1
    per_cell = {c.name + (f" (C={c.budget})" if several else ""): c.devices or ["not recorded"] for c in report.cells}
    if len({tuple(d) for d in per_cell.values()}) == 1:
        return "Device: " + " and ".join(next(iter(per_cell.values()))) + " (every cell)."
    return "Devices: " + "; ".join(f"{row}: {' and '.join(d)}" for row, d in per_cell.items()) + "."


def _ppl_note(report: Report) -> str:
    """The perplexity setting of the report's cells; names the cells when they differ (not comparable)."""
    settings: dict[str, list[str]] = {}
    for c in report.cells:
        if c.ppl_setting:
            settings.setdefault(c.ppl_setting, []).append(c.name)
    if not settings:
        return ""
    if len(settings) == 1:
        return f" ({next(iter(settings))})"
    each = "".join(f"; {', '.join(rows)}: {setting}" for setting, rows in settings.items())
    return each + " — **settings differ, so these perplexities are not comparable**"


def seed_table(report: Report) -> list[str]:
    """Markdown lines of :func:`seed_summary` (empty when no row has two seeds); a perplexity-only study
    (:func:`has_scores` false) drops the accuracy columns.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The lines.
    """
    summary = report.seed_summary
    if not summary:
        return []
    scored = report.has_scores

    def spread(s: Spread | None, digits: int) -> str:
        if s is None:
            return "–"
        return f"{s.mean:.{digits}f}" + ("" if s.sd is None else f" ± {s.sd:.{digits}f}")

    def over(s: Spread | None, fmt: str, scale: float = 1.0) -> str:
        if s is None:
            return "–"
        stderr = f" ± {fmt.format(scale * s.stderr).lstrip('+')} (n={s.n})" if s.stderr is not None else " (n=1)"
        return fmt.format(scale * s.mean) + stderr

    columns = [
        "method",
        "vs",
        "C",
        "seeds",
        *(["avg"] if scored else []),
        "ppl",
        "ppl / vs, per seed",
        "ppl / vs, over seeds",
        *(["− vs, per seed", "− vs, over seeds"] if scored else []),
    ]
    legend = (
        f"{'avg, ppl' if scored else 'ppl'}: mean ± standard deviation over the seeds; ppl / vs: perplexity "
        "divided by the reference row's of the same seed"
        + ("; − vs: the average paired difference from the reference row in points" if scored else "")
        + "; per seed, then mean ± standard error over the seeds, which includes the spread of training"
    )
    lines = ["", f"Over seeds ({legend}):", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for s in summary:
        ratios = ", ".join(f"{r:.3f} (s{seed})" for seed, r in s.ppl_ratio_per_seed.items()) or "–"
        cells = [
            s.row,
            s.reference or "–",
            str(s.budget),
            ", ".join(map(str, s.seeds)),
            *([spread(s.average, 3)] if scored else []),
            spread(s.ppl, 1),
            ratios,
            over(s.ppl_ratio, "{:.3f}"),
        ]
        if scored:  # in points
            cells += [
                ", ".join(f"{100 * d:+.1f} (s{seed})" for seed, d in s.vs_reference_per_seed.items()) or "–",
                over(s.vs_reference, "{:+.1f}", scale=100),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def paired_table(report: Report) -> list[str]:
    """Markdown lines: each method minus its reference row (:class:`Row`'s ``reference``) at the same
    budget on the same examples (± paired standard error, :func:`paired_difference`), per task, and a line naming
    the evaluated cells whose reference is evaluated too but could not be paired (a side without per-example
    scores); empty when neither exists.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The lines.
    """
    paired = [c for c in report.cells if c.vs_reference]
    evaluated = {c.key() for c in report.cells if c.scores}
    unpaired = [c for c in report.cells if c.scores and not c.vs_reference and c.reference_key in evaluated]
    lines = _paired_rows(report, paired) if paired else []
    if unpaired:
        lines += [
            "",
            "Not paired (one side has no per-example scores, e.g. a reference carried from a report "
            "written before they were kept; evaluating both cells again pairs them): "
            + ", ".join(f"{c.name} vs {c.reference} (C = {c.budget})" for c in unpaired)
            + ".",
        ]
    return lines


def _paired_rows(report: Report, paired: list[Cell]) -> list[str]:
    """The markdown table of :func:`paired_table` for the ``paired`` cells."""
    tasks = [t for t in report.tasks if any(t in c.vs_reference for c in paired)]
    lines = [
        "",
        (
            "Difference from the reference row (`vs`: the row it is measured against — Fix with the same loss for a "
            "pure linear student, the untrained window-plus-sink control for a window student, its student for a "
            "control) at the same budget, on the same "
            "examples (points of the primary metric, ± paired standard error; – where either cell lacks "
            "per-example scores; avg: over the tasks, standard error √(Σ SE²) / number of tasks):"
        ),
        "",
        "| method | vs | C | " + " | ".join(tasks) + " | avg |",
        "|" + "---|" * (len(tasks) + 4),
    ]
    for c in paired:
        diffs = [c.vs_reference.get(t) for t in tasks] + [c.vs_reference_average]
        lines.append(
            f"| {c.name} | {c.reference} | {c.budget} | "
            + " | ".join("–" if d is None else f"{100 * d.difference:+.1f} ± {100 * d.stderr:.1f}" for d in diffs)
            + " |"
        )
    return lines


def curve_table(report: Report, tail: int = 5) -> list[str]:
    """Markdown lines: each fitted cell's validation perplexity at every validation step and, where its
    reference row (``vs``: Fix with the same loss) has a curve at the same budget, the ratio to it at the last
    shared step and the mean ratio over the last ``tail`` shared steps (one validation point of one seed is
    noisy). That mean is "–" for a curve with fewer than ``tail`` shared steps: a
    few widely spaced validations can span different stages (the full recipe validates once after the
    layer-wise stage and once after the end-to-end tail), whose mean answers no question. Empty when no cell
    has a curve.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).
        tail: how many last shared steps the mean ratio averages.

    Returns:
        The lines.
    """
    curved = [c for c in report.cells if c.fit and c.fit.val_curve]
    if not curved:
        return []
    steps = sorted({step for c in curved for step, _ in c.fit.val_curve})
    lines = [
        "",
        "Validation perplexity during the fit (held-out blocks; step = optimizer step index):",
        "",
        "| method | vs | C | Σ M | dims | "
        + " | ".join(str(s) for s in steps)
        + f" | / vs (last) | / vs (mean of last {tail}) |",
        "|" + "---|" * (len(steps) + 7),
    ]
    for c in curved:
        curve, dims = dict(c.fit.val_curve), c.fit.feature_dims or []
        heads = [m for layer in dims for m in (layer if isinstance(layer, list) else [layer])]  # per-head dims too
        reference = report.reference_curve(c)
        ratios = [curve[s] / reference[s] for s in steps if s in curve and s in reference]
        cells = [
            c.name,
            c.reference or "–",
            str(c.budget),
            _fmt_total(c.fit.total_features),
            f"{min(heads)}…{max(heads)}" if heads else "–",
            *[_fmt(curve.get(s), 1) for s in steps],
            _fmt(ratios[-1] if ratios else None),
            _fmt(mean_of(ratios[-tail:]) if len(ratios) >= tail else None),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
