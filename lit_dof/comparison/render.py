"""The report as markdown: the Table-3-shaped table of :func:`~lit_dof.comparison.collect.collect`'s report and
its sections (fine-tuning, paired differences, seeds, validation curves, perplexity by position, devices)."""

from __future__ import annotations

import math

from lit_dof.comparison.beyond_window import beyond_exact_lines, retrieval_lines, seed_pair_lines
from lit_dof.comparison.lookup import (
    cell_key,
    cell_label,
    has_scores,
    reference_curve,
    validation_curves,
    with_references,
)
from lit_dof.comparison.summary import mean_of
from lit_dof.evaluation.task_data import TASKS


def _fmt(value, digits=3):
    return "–" if value is None else f"{value:.{digits}f}"


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


def _fmt_bytes(state: dict | None) -> str:
    """A cell's decoding state (``{"context", "bytes"}``) in MiB at its context; "–" when not measured."""
    return "–" if not state else f"{state['bytes'] / 2**20:.2f} MiB @ {state['context']}"


def markdown(report: dict, header: str = "") -> str:
    """The Table-3-shaped markdown of :func:`collect`'s report.

    Args:
        report: :func:`~lit_dof.comparison.collect.collect`'s report.
        header: a first line (e.g. a title); none when empty.

    Returns:
        The markdown text.
    """
    report = with_references(report)
    tasks = report["tasks"]
    scored = has_scores(report)  # a perplexity-only study (the λ study) drops the task columns
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
    for c in report["cells"]:
        fit = c["fit"] or {}
        uses_dof = fit.get("strategy") in ("dof", "dof_clip")
        lam = fit.get("lam") if uses_dof else None
        lam_text = (
            "–" if lam is None else f"2^{math.log2(lam):.1f}" + (" (auto)" if fit.get("lam_rule") == "auto" else "")
        )
        if lam is not None and fit.get("relative_to"):
            lam_text += " · tr(G)/J" if fit["relative_to"] == "trace" else f" · {fit['relative_to']}(G)"
        wall = fit.get("wall_seconds")
        scores = (
            [
                *[_fmt(c["scores"].get(t, {}).get("value")) for t in tasks],
                _fmt(c["average"]),
                _fmt(c.get("gap_closed"), 2),
            ]
            if scored
            else []
        )
        row = [
            cell_label(c),
            *scores,
            _fmt(c["ppl"], 1),
            str(c["budget"]) if c["kind"] != "teacher" else "–",
            _fmt_total(fit.get("total_features")),
            _fmt_bytes(c.get("state")),
            lam_text,
            str(fit.get("num_samples") or "–") if uses_dof else "–",
            _fmt_tokens(fit.get("tokens")),
            f"{wall / 60:.0f} min" if wall else "–",
            c["note"],
        ]
        lines.append("| " + " | ".join(row) + " |")
    if report.get("pending"):
        lines += ["", "Not measured yet (re-running the command resumes here): " + ", ".join(report["pending"]) + "."]
    if report.get("not_applicable"):
        lines += ["", "Controls the students do not have: " + ", ".join(report["not_applicable"]) + "."]
    if report.get("carried"):
        lines += [
            "",
            "Carried from this folder's earlier comparison.json (no run directory of theirs under the "
            "output folder now; their records are unchanged): " + ", ".join(report["carried"]) + ".",
        ]
    finetuned_tasks = sorted({t for c in report["cells"] for t in c.get("finetuned", {})})
    if finetuned_tasks:
        lines += [
            "",
            (
                "Fine-tuned per task (METHOD.md §4; accuracy of the best epoch, MMLU: last; learning rate "
                "from the teacher's grid):"
            ),
            "",
            "| method | " + " | ".join(finetuned_tasks) + " |",
            "|" + "---|" * (len(finetuned_tasks) + 1),
        ]
        for c in report["cells"]:
            if c.get("finetuned"):
                scores = [_fmt(c["finetuned"].get(t)) for t in finetuned_tasks]
                lines.append(f"| {cell_label(c)} | " + " | ".join(scores) + " |")
    lines += beyond_exact_lines(report)
    lines += paired_table(report)
    lines += seed_table(report)
    lines += curve_table(report)
    lines += _position_sections(report)
    lines += retrieval_lines(report)
    lines += seed_pair_lines(report)
    lines += ["", _device_note(report), ""]
    extra = [t for t in tasks if t not in TASKS]  # shown, not averaged
    lines.append(
        "Metrics: "
        + ", ".join(f"{t} {m}" for t, m in report["primary_metric"].items() if t in tasks)
        + (". avg: the seven zero-shot tasks (not " + ", ".join(extra) + ")" if extra else "")
        + ". gap closed = (avg − Performer avg) / (teacher avg − Performer avg). ppl: sliding-window "
        "perplexity on held-out Wikipedia documents" + _ppl_note(report) + "."
    )
    return "\n".join(lines)


def _position_sections(report: dict) -> list[str]:
    """Perplexity by position and at long contexts (:mod:`~lit_dof.evaluation.position_report`), each cell paired
    with the teacher and with its reference row of the same budget and seed."""
    from lit_dof.evaluation.position_report import long_context_lines, long_document_lines, position_lines

    labels = {(c["row"], c["budget"], c.get("seed")): cell_label(c) for c in report["cells"]}  # hand-made: no seed
    teacher = next((cell_label(c) for c in report["cells"] if c["kind"] == "teacher"), None)
    models = [
        {
            "label": cell_label(c),
            "by_position": c.get("by_position"),
            "long": c.get("long"),
            "long_documents": c.get("long_documents"),
            "reference": labels.get((c["reference"], c["budget"], c.get("seed"))) if c.get("reference") else None,
        }
        for c in report["cells"]
    ]
    lines = position_lines(models, teacher) + long_context_lines(models, teacher)
    return lines + long_document_lines(models, teacher)


def _device_note(report: dict) -> str:
    """Where the cells were measured (fits, perplexity, evaluations): one device for all, or per cell."""
    several = len({c["budget"] for c in report["cells"]}) > 1
    per_cell = {
        cell_label(c) + (f" (C={c['budget']})" if several else ""): c.get("devices") or ["not recorded"]
        for c in report["cells"]
    }
    if len({tuple(d) for d in per_cell.values()}) == 1:
        return "Device: " + " and ".join(next(iter(per_cell.values()))) + " (every cell)."
    return "Devices: " + "; ".join(f"{row}: {' and '.join(d)}" for row, d in per_cell.items()) + "."


def _ppl_note(report: dict) -> str:
    """The perplexity setting of the report's cells; names the cells when they differ (not comparable)."""
    settings: dict[str, list[str]] = {}
    for c in report["cells"]:
        if c.get("ppl_setting"):
            settings.setdefault(c["ppl_setting"], []).append(cell_label(c))
    if not settings:
        return ""
    if len(settings) == 1:
        return f" ({next(iter(settings))})"
    each = "".join(f"; {', '.join(rows)}: {setting}" for setting, rows in settings.items())
    return each + " — **settings differ, so these perplexities are not comparable**"


def seed_table(report: dict) -> list[str]:
    """Markdown lines of :func:`seed_summary` (empty when no row has two seeds); a perplexity-only study
    (:func:`has_scores` false) drops the accuracy columns.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The lines.
    """
    summary = report.get("seed_summary") or []
    if not summary:
        return []
    scored = has_scores(report)

    def spread(s: dict | None, digits: int) -> str:
        if s is None:
            return "–"
        return f"{s['mean']:.{digits}f}" + ("" if s["sd"] is None else f" ± {s['sd']:.{digits}f}")

    def over(s: dict | None, fmt: str) -> str:
        if s is None:
            return "–"
        return fmt.format(s["mean"]) + (
            f" ± {fmt.format(s['stderr']).lstrip('+')} (n={s['n']})" if s.get("stderr") is not None else " (n=1)"
        )

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
        ratios = ", ".join(f"{r:.3f} (s{seed})" for seed, r in s["ppl_ratio_per_seed"].items()) or "–"
        cells = [
            s["row"],
            s["reference"] or "–",
            str(s["budget"]),
            ", ".join(map(str, s["seeds"])),
            *([spread(s["average"], 3)] if scored else []),
            spread(s["ppl"], 1),
            ratios,
            over(s["ppl_ratio"], "{:.3f}"),
        ]
        if scored:  # in points
            points = s["vs_reference"] and {
                k: v if k == "n" or v is None else 100 * v for k, v in s["vs_reference"].items()
            }
            cells += [
                ", ".join(f"{100 * d:+.1f} (s{seed})" for seed, d in s["vs_reference_per_seed"].items()) or "–",
                over(points, "{:+.1f}"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def paired_table(report: dict) -> list[str]:
    """Markdown lines: each method minus its reference row (:class:`Row`'s ``reference``) at the same
    budget on the same examples (± paired standard error, :func:`paired_difference`), per task, and a line naming
    the evaluated cells whose reference is evaluated too but could not be paired (a side without per-example
    scores); empty when neither exists.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The lines.
    """
    paired = [c for c in report["cells"] if c.get("vs_reference")]
    evaluated = {cell_key(c["row"], c) for c in report["cells"] if c.get("scores")}
    unpaired = [
        c
        for c in report["cells"]
        if c.get("scores") and not c.get("vs_reference") and cell_key(c.get("reference"), c) in evaluated
    ]
    lines = _paired_rows(report, paired) if paired else []
    if unpaired:
        lines += [
            "",
            "Not paired (one side has no per-example scores, e.g. a reference carried from a report "
            "written before they were kept; evaluating both cells again pairs them): "
            + ", ".join(f"{cell_label(c)} vs {c['reference']} (C = {c['budget']})" for c in unpaired)
            + ".",
        ]
    return lines


def _paired_rows(report: dict, paired: list[dict]) -> list[str]:
    """The markdown table of :func:`paired_table` for the ``paired`` cells."""
    tasks = [t for t in report["tasks"] if any(t in c["vs_reference"] for c in paired)]
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
        diffs = [c["vs_reference"].get(t) for t in tasks] + [c.get("vs_reference_average")]
        lines.append(
            f"| {cell_label(c)} | {c['reference']} | {c['budget']} | "
            + " | ".join("–" if d is None else f"{100 * d['difference']:+.1f} ± {100 * d['stderr']:.1f}" for d in diffs)
            + " |"
        )
    return lines


def curve_table(report: dict, tail: int = 5) -> list[str]:
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
    curved = [c for c in report["cells"] if (c["fit"] or {}).get("val_curve")]
    if not curved:
        return []
    steps = sorted({step for c in curved for step, _ in c["fit"]["val_curve"]})
    curves = validation_curves(report)
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
        curve, dims = dict(c["fit"]["val_curve"]), c["fit"].get("feature_dims") or []
        heads = [m for layer in dims for m in (layer if isinstance(layer, list) else [layer])]  # per-head dims too
        reference = reference_curve(c, curves)
        ratios = [curve[s] / reference[s] for s in steps if s in curve and s in reference]
        cells = [
            cell_label(c),
            c.get("reference") or "–",
            str(c["budget"]),
            _fmt_total(c["fit"].get("total_features")),
            f"{min(heads)}…{max(heads)}" if heads else "–",
            *[_fmt(curve.get(s), 1) for s in steps],
            _fmt(ratios[-1] if ratios else None),
            _fmt(mean_of(ratios[-tail:]) if len(ratios) >= tail else None),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
