"""The report's sections on what lies beyond a student's exact window: the long-document test set by in-document
position, retrieval by context, and — the runs being the unit — each student against its reference and its controls
over seeds (mean of the per-seed paired comparisons ± its standard error over seeds, 95% t interval).

A pair is (student, other): a student row with its reference row (e.g. the quickstart and the untrained
window-plus-sink control ``swa_sink``), and a student with each of its control rows (``<row>:<control>``), so
that every ratio reads "student / other" and every difference "student − other".
"""

from __future__ import annotations

import math

from lit_dof.comparison.lookup import cell_key, cell_label
from lit_dof.evaluation.stats import paired_difference, paired_seed_difference


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def beyond_exact_lines(report: dict) -> list[str]:
    """The share of each task's examples longer than a cell's exact positions (window + sinks): the only examples
    on which a window + sinks student, or a control behind a window, can score differently from its teacher; empty
    when no cell records it.

    Args:
        report: a report.

    Returns:
        The lines.
    """
    cells = [c for c in report["cells"] if any("beyond_exact" in s for s in c["scores"].values())]
    if not cells:
        return []
    tasks = [t for t in report["tasks"] if any("beyond_exact" in c["scores"].get(t, {}) for c in cells)]
    title = (
        "Examples beyond the exact window (the share of each task's examples longer than the model's window + sinks: "
        "the only ones on which it can score differently from its teacher):"
    )
    lines = ["", title, "", "| model | " + " | ".join(tasks) + " |", "|" + "---|" * (len(tasks) + 1)]
    for c in cells:
        shares = [_pct(c["scores"].get(t, {}).get("beyond_exact")) for t in tasks]
        lines.append(f"| {cell_label(c)} | " + " | ".join(shares) + " |")
    return lines


def retrieval_lines(report: dict) -> list[str]:
    """The "Retrieval" section: per task, each cell's exact match overall (± SE over examples) and by context
    (mean over needle depths), the share of needles beyond its window, and its paired difference from its reference
    on the same examples; empty when no cell has a retrieval record.

    Args:
        report: a report (:func:`~lit_dof.comparison.collect.collect`).

    Returns:
        The lines.
    """
    cells = [c for c in report["cells"] if c.get("retrieval")]
    if not cells:
        return []
    by_key = {cell_key(c["row"], c): c for c in cells}
    title = (
        "Retrieval (greedy generation, exact match; by context: mean over needle depths; beyond: needles outside the "
        "model's exact window; − reference: paired over the same examples, ± SE):"
    )
    lines = ["", title]
    for task in sorted({t for c in cells for t in c["retrieval"]}):
        shown = [c for c in cells if task in c["retrieval"]]
        contexts = sorted({int(k) for c in shown for k in c["retrieval"][task]["cells"] or {}})
        columns = ["model", "all", *(f"{k} tokens" for k in contexts), "beyond", "− reference"]
        lines += ["", f"`{task}`:", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for c in shown:
            entry = c["retrieval"][task]
            by_context = [entry["cells"].get(str(k)) if entry["cells"] else None for k in contexts]
            means = [_pct(_mean([d["mean"] for d in row.values()])) if row else "–" for row in by_context]
            reference = by_key.get(cell_key(c.get("reference"), c))
            overall = f"{_pct(entry['exact_match'])} ± {_pct(entry['exact_match_stderr'])} (n={entry['n']})"
            paired = _paired_text(entry, (reference or {}).get("retrieval", {}).get(task))
            cells_text = [cell_label(c), overall, *means, _pct(entry.get("beyond_window")), paired]
            lines.append("| " + " | ".join(cells_text) + " |")
    return lines


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _paired_text(entry: dict, reference: dict | None) -> str:
    """``difference ± SE`` in points over the same examples, or ``–``."""
    if not reference or not entry.get("items") or len(entry["items"]) != len(reference.get("items") or []):
        return "–"
    difference, stderr, _ = paired_difference(entry["items"], reference["items"])
    return f"{100 * difference:+.0f} ± {100 * stderr:.0f}"


def seed_pairs(report: dict) -> list[dict]:
    """Each student against its reference and each of its controls, over the seeds both were measured with.

    Args:
        report: a report.

    Returns:
        One entry per (student, other, budget) with two or more seeds in common: ``{"student", "other", "budget",
        "seeds", "controlled" (other is a control of the student), "ppl", "long_documents": {bucket: ...},
        "retrieval": {task: ...}}``; perplexities compared as ratios
        (:func:`~lit_dof.evaluation.stats.paired_seed_difference` with ``log``), exact match as differences; a
        comparison without two seeds on both sides is ``None``.
    """
    cells = {cell_key(c["row"], c): c for c in report["cells"]}
    pairs: dict[tuple, list[tuple[int, dict, dict]]] = {}
    for c in report["cells"]:
        other = cells.get(cell_key(c.get("reference"), c))
        if other is None or c["kind"] == "teacher":
            continue
        student, against = (other, c) if c["kind"] == "control" else (c, other)
        pairs.setdefault((student["row"], against["row"], c["budget"]), []).append(
            (c.get("seed") or 0, student, against)
        )
    out = []
    for (student, other, budget), runs in pairs.items():
        if len({seed for seed, _, _ in runs}) < 2:
            continue
        entry = {"student": student, "other": other, "budget": budget, "seeds": sorted(seed for seed, _, _ in runs)}
        entry["controlled"] = runs[0][2]["kind"] == "control"
        entry["ppl"] = _compare(runs, lambda c: c.get("ppl"), log=True)
        buckets = {b for _, s, _ in runs for b in ((s.get("long_documents") or {}).get("buckets") or {})}
        entry["long_documents"] = {
            b: _compare(runs, lambda c, b=b: _bucket_ppl(c, b), log=True) for b in sorted(buckets, key=_bucket_start)
        }
        tasks = {t for _, s, _ in runs for t in s.get("retrieval") or {}}
        entry["retrieval"] = {t: _compare(runs, lambda c, t=t: _exact_match(c, t)) for t in sorted(tasks)}
        out.append(entry)
    return out


def _bucket_start(bucket: str) -> int:
    return int(bucket.split("-")[0])


def _bucket_ppl(c: dict, bucket: str) -> float | None:
    return (((c.get("long_documents") or {}).get("buckets") or {}).get(bucket) or {}).get("ppl")


def _exact_match(c: dict, task: str) -> float | None:
    return ((c.get("retrieval") or {}).get(task) or {}).get("exact_match")


def _compare(runs: list[tuple[int, dict, dict]], measure, log: bool = False) -> dict | None:
    """:func:`paired_seed_difference` of ``measure`` over the runs where both sides have it (``None`` under 2)."""
    both = {seed: (measure(s), measure(o)) for seed, s, o in runs}
    both = {seed: values for seed, values in both.items() if None not in values}
    if len(both) < 2:
        return None
    return paired_seed_difference({k: v[0] for k, v in both.items()}, {k: v[1] for k, v in both.items()}, log=log)


def seed_pair_lines(report: dict) -> list[str]:
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
    buckets = sorted({b for p in pairs for b in p["long_documents"]}, key=_bucket_start)
    tasks = sorted({t for p in pairs for t in p["retrieval"]})
    columns = ["student", "other", "C", "seeds", "ppl ratio", *(f"long docs {b}" for b in buckets)]
    columns += [f"{t} − other" for t in tasks]
    title = (
        "Each student against its reference and its controls over seeds (the runs are the unit: per seed the student "
        "and the other model, then the mean over seeds ± its standard error [95% t interval]; perplexity: "
        "geometric-mean ratio student / other; retrieval: exact-match difference in points):"
    )
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for p in pairs:
        cells = [p["student"], p["other"], str(p["budget"]), ", ".join(map(str, p["seeds"])), _ratio(p["ppl"])]
        cells += [_ratio(p["long_documents"].get(b)) for b in buckets]
        cells += [_points(p["retrieval"].get(t)) for t in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _beyond_the_seed_table(pair: dict) -> bool:
    """Whether a pair says more than the seed table's perplexity ratio: a control, long documents or retrieval."""
    return pair["controlled"] or any(pair["long_documents"].values()) or any(pair["retrieval"].values())


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
