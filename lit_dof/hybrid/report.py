"""The hybrid report: ``hybrid.md`` (search trajectory, exported hybrids, orderings compared at equal numbers
of linear layers on held-out items), ``hybrid.json`` (the numbers) and ``hybrid.png`` (score vs linear
layers, one line per ordering), written atomically from a search's record (:mod:`lit_dof.hybrid.state`).
Which score is better comes from the search's :class:`~lit_dof.hybrid.search.Tolerance`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from lit_dof.extras import require
from lit_dof.hybrid.record import SearchRecord, hybrid_key
from lit_dof.hybrid.search import Tolerance
from lit_dof.io import atomic_write_bytes, atomic_write_text

NAMES = {
    "greedy": "greedy search",
    "dof": "DoF-guided (low DoF first)",
    "loss": "local-loss-guided (low loss first)",
    "uniform": "uniform interleaving",
    "random": "random (seeded)",
}


def _verdict(score: float, threshold: float, tolerance: Tolerance) -> str:
    """``"yes"``/``"no"``: the report's "within tolerance" cell."""
    return "yes" if tolerance.within(score, threshold) else "no"


def _layers(linear: list[int], num_layers: int) -> str:
    """``"k/L (p%)"``: how many of the ``num_layers`` layers are linear."""
    return f"{len(linear)}/{num_layers} ({len(linear) / num_layers:.0%})"


@dataclass
class OrderingCost:
    """What an ordering cost: evaluations and seconds to *choose* it, held-out evaluations and seconds to score
    its curve."""

    search_evaluations: int
    search_seconds: float
    heldout_evaluations: int
    heldout_seconds: float


def ordering_costs(record: SearchRecord) -> dict[str, OrderingCost]:
    """Per ordering: evaluations and seconds to *choose* the order (greedy: its search; loss: the local
    losses; dof: none here, the fit's DoF estimate is reused; uniform/random: none) and to score its curve."""
    timing, costs = record.timing, {}
    for name, order in record.orders.items():
        keys = {hybrid_key(order[:k]) for k in record.curves[name]}
        curve_seconds = sum(record.heldout[k].seconds for k in keys if k in record.heldout)
        if name == "greedy":
            choose = (record.search.evaluations, timing.search + timing.local_loss)
        else:
            choose = (0, timing.local_loss) if name == "loss" else (0, 0.0)
        costs[name] = OrderingCost(*choose, len(keys), curve_seconds)
    return costs


def winners(record: SearchRecord) -> tuple[dict[int, list[str]], list[str]]:
    """Best ordering(s) at each count, and the ordering(s) with the best mean over the counts all of them reach
    (every ordering tied at that mean; empty when no count is shared)."""
    tolerance, curves = record.settings.rule, record.curves
    per_count = {}
    for k in record.counts:
        scores = {name: curve[k] for name, curve in curves.items() if k in curve}
        if scores:
            best = tolerance.best(scores.values())
            per_count[k] = [name for name, v in scores.items() if v == best]
    shared = [k for k in record.counts if all(k in c for c in curves.values())]
    if not shared:
        return per_count, []
    mean = {name: sum(c[k] for k in shared) / len(shared) for name, c in curves.items()}
    best = mean[tolerance.best(mean, key=mean.get)]
    return per_count, [name for name, v in mean.items() if v == best]


def markdown(record: SearchRecord) -> str:
    """``hybrid.md`` from a finished search's record (see :class:`lit_dof.hybrid.run.HybridSearch`)."""
    s, search, timing = record.settings, record.search, record.timing
    metric, tolerance, L = s.metric, s.rule, record.num_layers
    fmt = (lambda v: f"{v:.4f}") if metric != "perplexity" else (lambda v: f"{v:.2f}")
    tol = f"{s.tolerance:.0%} of the teacher" if s.relative else f"{s.tolerance} {metric} (absolute)"
    lines = [
        f"# Hybrid models: Distill-then-Replace on {record.teacher_title}",
        "",
        f"- Twin bank: `{s.bank}` (every layer's linear twin, trained locally on the teacher's inputs"
        + (f": {record.bank_recipe})." if record.bank_recipe else ")."),
        f"- Target: {s.task or s.corpus}, metric **{metric}**; {record.items}.",
        f"- Search on {s.search_items} items, held-out comparison on {s.heldout_items} other items.",
        f"- Tolerance: a hybrid passes if its score is within {tol}: search threshold {fmt(search.threshold)} "
        f"(teacher {fmt(search.teacher_score)}), held-out threshold {fmt(record.heldout_threshold)} "
        f"(teacher {fmt(record.teacher_heldout)}).",
        f"- Shortlist: {s.shortlist_k} lowest {s.shortlist} per round"
        if s.shortlist
        else "- Shortlist: none (every remaining layer)",
        f"- Layer DoF from {record.dof_source}; local losses measured on the search items.",
    ]
    if record.command:
        lines += ["", "Command:", "", f"    {record.command}"]
    lines += [
        "",
        "## Greedy search",
        "",
        "| round | layer chosen | search score | linear layers | evaluations | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in record.rounds:
        chosen = r.chosen if r.passed else "— (none passes: stop)"
        score = fmt(r.score) if r.passed else f"best {fmt(tolerance.best(r.scores.values()))}"
        lines.append(f"| {r.index} | {chosen} | {score} | {len(r.linear)}/{L} | {r.evaluations} | {r.seconds:.0f} |")
    total_min = search.seconds / 60
    lines += [
        "",
        f"Search: {search.evaluations} evaluations in {total_min:.1f} min "
        f"({search.evaluations / max(total_min, 1e-9):.2f} evaluations/min, prefix cache "
        f"{'on' if s.prefix_cache else 'off'}); "
        f"local losses {timing.local_loss:.0f} s.",
    ]
    confirm = record.confirm
    if confirm:
        lines += [
            "",
            f"## Confirmation on {confirm.items} validation items the search did not use",
            "",
            f"Teacher {fmt(confirm.scores[hybrid_key(())].score)}, threshold {fmt(confirm.threshold)}. The search's "
            "hybrids, most linear first, until one passes; that one is exported as `most_linear`.",
            "",
            "| linear layers | confirmation score | passes |",
            "|---|---|---|",
        ]
        for r in reversed([r for r in record.rounds if r.passed]):
            entry = confirm.scores.get(hybrid_key(r.linear))
            if entry is None:
                break
            verdict = _verdict(entry.score, confirm.threshold, tolerance)
            lines.append(f"| {len(r.linear)} | {fmt(entry.score)} | {verdict} |")
        lines += ["", f"Confirmation: {len(confirm.scores)} evaluations in {timing.confirm / 60:.1f} min."]
    lines += [
        "",
        "## Exported hybrids (held-out items)",
        "",
        "| hybrid | linear layers | which | held-out score | within tolerance |",
        "|---|---|---|---|---|",
        f"| teacher | 0/{L} | – | {fmt(record.teacher_heldout)} | – |",
    ]
    shown = [(f"{name} (`{entry.path}`)", entry.linear) for name, entry in record.exported.items()]
    if confirm and search.most_linear != record.exported.most_linear.linear:
        shown.append(("the search's most linear, before confirmation (not exported)", search.most_linear))
    for name, linear in shown:
        score = record.heldout[hybrid_key(linear)].score
        lines.append(
            f"| {name} | {_layers(linear, L)} | {linear} | {fmt(score)} | "
            f"{_verdict(score, record.heldout_threshold, tolerance)} |"
        )
    lines += _verification_lines(record, fmt)
    lines += _ordering_lines(record, fmt)
    lines += ["", f"Versions: {', '.join(f'{k} {v}' for k, v in record.versions.items())}.", ""]
    return "\n".join(lines)


def _verification_lines(record: SearchRecord, fmt) -> list[str]:
    """The report's verification section (none without one)."""
    verify, L = record.verify, record.num_layers
    if not verify:
        return []
    lines = [
        "",
        f"## Verification on {verify.items} held-out items",
        "",
        f"The teacher and the exported hybrids once more, on more items than the orderings' curves "
        f"(threshold {fmt(verify.threshold)}).",
        "",
        "| hybrid | linear layers | score | within tolerance |",
        "|---|---|---|---|",
        f"| teacher | 0/{L} | {fmt(verify.scores[hybrid_key(())].score)} | – |",
    ]
    for name, entry in record.exported.items():
        score = verify.scores[hybrid_key(entry.linear)].score
        lines.append(
            f"| {name} | {_layers(entry.linear, L)} | {fmt(score)} | "
            f"{_verdict(score, verify.threshold, record.settings.rule)} |"
        )
    return lines + ["", f"Verification: {len(verify.scores)} evaluations in {record.timing.verify / 60:.1f} min."]


def _ordering_lines(record: SearchRecord, fmt) -> list[str]:
    """The report's comparison of orderings at equal numbers of linear layers, with their costs and winners."""
    counts, costs = record.counts, ordering_costs(record)
    lines = [
        "",
        "## Orderings at equal numbers of linear layers (held-out items)",
        "",
        "| ordering | "
        + " | ".join(f"{k} linear" for k in counts)
        + " | evaluations to choose | time to choose (s) | held-out evaluations | time to score (s) |",
        "|---|" + "---|" * (len(counts) + 4),
    ]
    for name, curve in record.curves.items():
        cells = [fmt(curve[k]) if k in curve else "–" for k in counts]
        c = costs[name]
        lines.append(
            f"| {NAMES[name]} | " + " | ".join(cells) + f" | {c.search_evaluations} | {c.search_seconds:.0f} | "
            f"{c.heldout_evaluations} | {c.heldout_seconds:.0f} |"
        )
    per_count, overall = winners(record)
    lines += ["", "Orders (first = first replaced):", ""]
    lines += [f"- {NAMES[name]}: {order}" for name, order in record.orders.items()]
    lines += ["", "Winner per count: " + "; ".join(f"{k} linear: {', '.join(v)}" for k, v in per_count.items()) + "."]
    if overall:
        tied = " (tied)" if len(overall) > 1 else ""
        lines += [f"Best mean over the counts: **{', '.join(NAMES[name] for name in overall)}**{tied}."]
    if record.settings.metric != "perplexity":
        n = record.settings.heldout_items
        lines += [
            f"One held-out item is {1 / n:.4f}; a score p has the binomial standard error √(p(1 − p)/n), at most "
            f"{0.5 / n**0.5:.4f} (p = 0.5), so differences between orderings smaller than about twice that are not "
            "resolved."
        ]
    return lines


def plot(record: SearchRecord) -> bytes:
    """PNG bytes: held-out score vs number of linear layers, one line per ordering.

    Raises:
        MissingExtraError: matplotlib is not installed (the ``plots`` extra).
    """
    require("matplotlib", "the hybrid report's figure")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))  # its own Agg canvas: the process's matplotlib backend is left alone
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for name, curve in record.curves.items():
        ks = sorted(curve)
        ax.plot([0, *ks], [record.teacher_heldout, *(curve[k] for k in ks)], marker="o", label=NAMES[name])
    ax.axhline(record.heldout_threshold, color="grey", linestyle="--", linewidth=1, label="tolerance")
    ax.set_xlabel("linear attention layers")
    ax.set_ylabel(f"held-out {record.settings.metric}")
    ax.set_title(f"{record.settings.task or record.settings.metric}: hybrids of {record.num_layers} layers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()


def write(record: SearchRecord, directory: Path) -> None:
    """Write ``hybrid.md``, ``hybrid.json`` and ``hybrid.png`` into ``directory`` (atomically)."""
    directory.mkdir(parents=True, exist_ok=True)
    record.save(directory / "hybrid.json")
    atomic_write_text(directory / "hybrid.md", markdown(record))
    atomic_write_bytes(directory / "hybrid.png", plot(record))
