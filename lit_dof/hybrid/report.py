"""The hybrid report: ``hybrid.md`` (search trajectory, exported hybrids, orderings compared at equal numbers
of linear layers on held-out items), ``hybrid.json`` (the numbers) and ``hybrid.png`` (score vs linear
layers, one line per ordering), written atomically from a search's record (:mod:`lit_dof.hybrid.state`).
Which score is better comes from the search's :class:`~lit_dof.hybrid.search.Tolerance`.
"""

from __future__ import annotations

import io
from pathlib import Path

from lit_dof.extras import require
from lit_dof.hybrid.search import Tolerance
from lit_dof.hybrid.state import hybrid_key
from lit_dof.io import atomic_write_bytes, atomic_write_json, atomic_write_text

NAMES = {
    "greedy": "greedy search",
    "dof": "DoF-guided (low DoF first)",
    "loss": "local-loss-guided (low loss first)",
    "uniform": "uniform interleaving",
    "random": "random (seeded)",
}


def tolerance_of(data: dict) -> Tolerance:
    """The search's acceptance rule, from its recorded settings."""
    s = data["settings"]
    return Tolerance.for_metric(s["metric"], s["tolerance"], s["relative"])


def _verdict(score: float, threshold: float, tolerance: Tolerance) -> str:
    """``"yes"``/``"no"``: the report's "within tolerance" cell."""
    return "yes" if tolerance.within(score, threshold) else "no"


def _layers(linear: list[int], num_layers: int) -> str:
    """``"k/L (p%)"``: how many of the ``num_layers`` layers are linear."""
    return f"{len(linear)}/{num_layers} ({len(linear) / num_layers:.0%})"


def ordering_costs(data: dict) -> dict[str, dict]:
    """Per ordering: evaluations and seconds to *choose* the order (greedy: its search; loss: the local
    losses; dof: none here, the fit's DoF estimate is reused; uniform/random: none) and to score its curve."""
    heldout, timing = data["heldout"], data["timing"]
    costs = {}
    for name, order in data["orders"].items():
        keys = {hybrid_key(order[: int(k)]) for k in data["curves"][name]}
        curve_seconds = sum(heldout[k]["seconds"] for k in keys if k in heldout)
        choose = {
            "greedy": (data["search"]["evaluations"], timing.get("search", 0.0) + timing.get("local_loss", 0.0)),
            "loss": (0, timing.get("local_loss", 0.0)),
        }.get(name, (0, 0.0))
        costs[name] = {
            "search_evaluations": choose[0],
            "search_seconds": choose[1],
            "heldout_evaluations": len(keys),
            "heldout_seconds": curve_seconds,
        }
    return costs


def winners(data: dict) -> tuple[dict[str, list[str]], str | None]:
    """Best ordering(s) at each count, and the ordering with the best mean over the counts all of them reach."""
    tolerance = tolerance_of(data)
    curves = data["curves"]
    per_count = {}
    for k in map(str, data["counts"]):
        scores = {name: curve[k] for name, curve in curves.items() if k in curve}
        if scores:
            best = tolerance.best(scores.values())
            per_count[k] = [name for name, v in scores.items() if v == best]
    shared = [k for k in map(str, data["counts"]) if all(k in c for c in curves.values())]
    if not shared:
        return per_count, None
    mean = {name: sum(c[k] for k in shared) / len(shared) for name, c in curves.items()}
    overall = tolerance.best(mean, key=mean.get)
    return per_count, overall


def markdown(data: dict, command: str | None = None) -> str:
    """``hybrid.md`` from the search state (see :class:`lit_dof.hybrid.run.HybridSearch`)."""
    s, search = data["settings"], data["search"]
    metric, tolerance = s["metric"], tolerance_of(data)
    L = data["num_layers"]
    fmt = (lambda v: f"{v:.4f}") if metric != "perplexity" else (lambda v: f"{v:.2f}")
    tol = f"{s['tolerance']:.0%} of the teacher" if s["relative"] else f"{s['tolerance']} {metric} (absolute)"
    lines = [
        "# Hybrid models: Distill-then-Replace on the embedded SmolLM2-135M-Instruct",
        "",
        f"- Twin bank: `{s['bank']}` (every layer's linear twin, trained locally on the teacher's inputs"
        + (f": {data['bank_recipe']})." if data.get("bank_recipe") else ")."),
        f"- Target: {s['task'] or s['corpus']}, metric **{metric}**; {data['items']}.",
        f"- Search on {s['search_items']} items, held-out comparison on {s['heldout_items']} other items.",
        f"- Tolerance: a hybrid passes if its score is within {tol}: search threshold {fmt(search['threshold'])} "
        f"(teacher {fmt(search['teacher_score'])}), held-out threshold {fmt(data['heldout_threshold'])} "
        f"(teacher {fmt(data['teacher_heldout'])}).",
        f"- Shortlist: {s['shortlist_k']} lowest {s['shortlist']} per round"
        if s["shortlist"]
        else "- Shortlist: none (every remaining layer)",
        f"- Layer DoF from {data['dof_source']}; local losses measured on the search items.",
    ]
    if command:
        lines += ["", "Command:", "", f"    {command}"]
    lines += [
        "",
        "## Greedy search",
        "",
        "| round | layer chosen | search score | linear layers | evaluations | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rounds"]:
        chosen = r["chosen"] if r["passed"] else "— (none passes: stop)"
        best_failed = tolerance.best(r["scores"].values())
        score = fmt(r["score"]) if r["passed"] else f"best {fmt(best_failed)}"
        lines.append(
            f"| {r['index']} | {chosen} | {score} | {len(r['linear'])}/{L} | {r['evaluations']} | {r['seconds']:.0f} |"
        )
    total_min = search["seconds"] / 60
    lines += [
        "",
        f"Search: {search['evaluations']} evaluations in {total_min:.1f} min "
        f"({search['evaluations'] / max(total_min, 1e-9):.2f} evaluations/min, prefix cache "
        f"{'on' if s['prefix_cache'] else 'off'}); "
        f"local losses {data['timing'].get('local_loss', 0):.0f} s.",
    ]
    confirm = data.get("confirm")
    if confirm:
        teacher_confirm = confirm["scores"]["teacher"]["score"]
        lines += [
            "",
            f"## Confirmation on {confirm['items']} validation items the search did not use",
            "",
            f"Teacher {fmt(teacher_confirm)}, threshold {fmt(confirm['threshold'])}. The search's hybrids, most "
            "linear first, until one passes; that one is exported as `most_linear`.",
            "",
            "| linear layers | confirmation score | passes |",
            "|---|---|---|",
        ]
        for r in reversed([r for r in data["rounds"] if r["passed"]]):
            entry = confirm["scores"].get(hybrid_key(r["linear"]))
            if entry is None:
                break
            verdict = _verdict(entry["score"], confirm["threshold"], tolerance)
            lines.append(f"| {len(r['linear'])} | {fmt(entry['score'])} | {verdict} |")
        minutes = data["timing"].get("confirm", 0) / 60
        lines += ["", f"Confirmation: {len(confirm['scores'])} evaluations in {minutes:.1f} min."]
    lines += [
        "",
        "## Exported hybrids (held-out items)",
        "",
        "| hybrid | linear layers | which | held-out score | within tolerance |",
        "|---|---|---|---|---|",
        f"| teacher | 0/{L} | – | {fmt(data['teacher_heldout'])} | – |",
    ]
    shown = [(f"{name} (`{entry['path']}`)", entry["linear"]) for name, entry in data["exported"].items()]
    if confirm and search["most_linear"] != data["exported"]["most_linear"]["linear"]:
        shown.append(("the search's most linear, before confirmation (not exported)", search["most_linear"]))
    for name, linear in shown:
        score = data["heldout"][hybrid_key(linear)]["score"]
        lines.append(
            f"| {name} | {_layers(linear, L)} | {linear} | {fmt(score)} | "
            f"{_verdict(score, data['heldout_threshold'], tolerance)} |"
        )
    verify = data.get("verify")
    if verify:
        scores = verify["scores"]
        lines += [
            "",
            f"## Verification on {verify['items']} held-out items",
            "",
            f"The teacher and the exported hybrids once more, on more items than the orderings' curves "
            f"(threshold {fmt(verify['threshold'])}).",
            "",
            "| hybrid | linear layers | score | within tolerance |",
            "|---|---|---|---|",
            f"| teacher | 0/{L} | {fmt(scores['teacher']['score'])} | – |",
        ]
        for name, entry in data["exported"].items():
            score = scores[hybrid_key(entry["linear"])]["score"]
            lines.append(
                f"| {name} | {_layers(entry['linear'], L)} | {fmt(score)} | "
                f"{_verdict(score, verify['threshold'], tolerance)} |"
            )
        lines += ["", f"Verification: {len(scores)} evaluations in {data['timing'].get('verify', 0) / 60:.1f} min."]
    counts = [str(k) for k in data["counts"]]
    costs = ordering_costs(data)
    lines += [
        "",
        "## Orderings at equal numbers of linear layers (held-out items)",
        "",
        "| ordering | "
        + " | ".join(f"{k} linear" for k in counts)
        + " | evaluations to choose | time to choose (s) | held-out evaluations | time to score (s) |",
        "|---|" + "---|" * (len(counts) + 4),
    ]
    for name, curve in data["curves"].items():
        cells = [fmt(curve[k]) if k in curve else "–" for k in counts]
        c = costs[name]
        lines.append(
            f"| {NAMES[name]} | " + " | ".join(cells) + f" | {c['search_evaluations']} | {c['search_seconds']:.0f} | "
            f"{c['heldout_evaluations']} | {c['heldout_seconds']:.0f} |"
        )
    per_count, overall = winners(data)
    lines += ["", "Orders (first = first replaced):", ""]
    lines += [f"- {NAMES[name]}: {order}" for name, order in data["orders"].items()]
    lines += ["", "Winner per count: " + "; ".join(f"{k} linear: {', '.join(v)}" for k, v in per_count.items()) + "."]
    if overall:
        lines += [f"Best mean over the counts: **{NAMES[overall]}**."]
    if metric != "perplexity":
        p, n = data["teacher_heldout"], s["heldout_items"]
        lines += [
            f"One held-out item is {1 / n:.4f}; the binomial standard error of one score is "
            f"≈ {(p * (1 - p) / n) ** 0.5:.4f}, so smaller differences between orderings are "
            "not resolved."
        ]
    lines += ["", f"Versions: {', '.join(f'{k} {v}' for k, v in data.get('versions', {}).items())}.", ""]
    return "\n".join(lines)


def plot(data: dict) -> bytes:
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
    for name, curve in data["curves"].items():
        ks = sorted(int(k) for k in curve)
        ax.plot([0, *ks], [data["teacher_heldout"], *(curve[str(k)] for k in ks)], marker="o", label=NAMES[name])
    ax.axhline(data["heldout_threshold"], color="grey", linestyle="--", linewidth=1, label="tolerance")
    ax.set_xlabel("linear attention layers")
    ax.set_ylabel(f"held-out {data['settings']['metric']}")
    ax.set_title(f"{data['settings']['task'] or data['settings']['metric']}: hybrids of {data['num_layers']} layers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()


def write(data: dict, directory: Path, command: str | None = None) -> None:
    """Write ``hybrid.md``, ``hybrid.json`` and ``hybrid.png`` into ``directory`` (atomically)."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(directory / "hybrid.json", data)
    atomic_write_text(directory / "hybrid.md", markdown(data, command))
    atomic_write_bytes(directory / "hybrid.png", plot(data))
