"""Retrieval against decode state: every row of one or more `lit-dof compare` reports as a point (issue #45's figure).

For each retrieval task in the reports (passkey, recall), one panel: x = the row's decode state per sequence at
``--context`` tokens (fp32 bytes, log scale), y = its exact match, the mean over its seeds (the number of seeds in
the label). The state record of each cell (`lit-dof compare`'s perplexity stage) holds its bytes at the scored
context T0 and its growth per further token — the KV caches of its softmax layers (all of a teacher's or a tail-only
control's, a hybrid's exact layers); the linear layers' window + sinks + far state are full by T0 — so the bytes at
``--context`` are ``bytes + growth · (context − T0)``. Records written before the growth was recorded (re-running
the stage adds it) fall back to: full softmax attention scaled linearly, every other state constant (a hybrid's
exact layers then undercounted; a warning says so). Dashed lines: 25% and 10% of the teacher's KV cache at that
context (the issue's bar and aim).

Usage: python tools/state_retrieval_plot.py REPORT.json [REPORT.json ...] --out FIGURE.png [--context 4096]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def state_at(cell: dict, state: dict, context: int) -> float:
    """A cell's decode state at ``context`` tokens (bytes) from its record at ``state["context"]`` (see above).

    Raises:
        SystemExit: ``context`` below the recorded context (a window's state may not be full there).
    """
    if context < state["context"]:
        raise SystemExit(f"--context {context} is below the recorded context {state['context']}: ask for ≥ it")
    if "growth" in state:
        return state["bytes"] + state["growth"] * (context - state["context"])
    full = cell.get("kind") == "teacher" or (cell.get("control") or {}).get("window", 0) is None
    if not full:
        print(f"warning: {cell['row']}: no growth recorded, its state held constant (re-run compare's ppl stage)")
    return state["bytes"] * context / state["context"] if full else state["bytes"]


def points(reports: list[dict], context: int) -> dict[str, dict[str, tuple[float, float, int]]]:
    """``{task: {row: (state bytes at context, mean exact match, seeds)}}`` over the reports' cells."""
    found: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for report in reports:
        for cell in report["cells"]:
            state = cell.get("state") or {}
            if not state.get("bytes"):
                continue
            nbytes = state_at(cell, state, context)
            for task, entry in (cell.get("retrieval") or {}).items():
                if entry and entry.get("exact_match") is not None:
                    found[task][cell["row"]].append((nbytes, entry["exact_match"]))
    return {
        task: {row: (sum(b for b, _ in v) / len(v), sum(m for _, m in v) / len(v), len(v)) for row, v in rows.items()}
        for task, rows in found.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="comparison.json files")
    parser.add_argument("--out", type=Path, required=True, help="the figure (PNG)")
    parser.add_argument("--context", type=int, default=4096, help="tokens at which states are counted")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_task = points([json.loads(p.read_text()) for p in args.reports], args.context)
    if not by_task:
        raise SystemExit("no cell of these reports has a retrieval record and a state")
    fig, axes = plt.subplots(1, len(by_task), figsize=(6.5 * len(by_task), 4.5), squeeze=False)
    for ax, (task, rows) in zip(axes[0], sorted(by_task.items()), strict=True):
        teacher = rows.get("teacher")
        for row, (nbytes, mean, seeds) in sorted(rows.items()):
            ax.scatter(nbytes / 2**20, mean, s=30)
            ax.annotate(f"{row}" + (f" ({seeds} seeds)" if seeds > 1 else ""), (nbytes / 2**20, mean), fontsize=7)
            print(f"{task}: {row}: {nbytes / 2**20:.2f} MiB, exact match {mean:.2f} over {seeds} run(s)")
        if teacher:
            for share in (0.25, 0.10):
                ax.axvline(teacher[0] * share / 2**20, linestyle="--", color="grey", linewidth=0.8)
        ax.set(xscale="log", xlabel=f"decode state per sequence at {args.context} tokens (MiB, fp32)")
        ax.set(ylabel="exact match", ylim=(-0.05, 1.05), title=task)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
