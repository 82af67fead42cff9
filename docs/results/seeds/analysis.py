"""The seeds study's analysis (issue #41; docs/results/seeds README, "The study: design"): each arm against `dof`
paired by seed on the design's endpoints, over the seeds both have measured.

    python docs/results/seeds/analysis.py [--reports docs/results/seeds/reports]

Per seed the arm's measure minus `dof`'s — perplexities as log ratios on the same test blocks and long documents,
retrieval and tasks as exact-match / accuracy points on the same prompts and questions — then over the seeds the
mean ± SE of those per-seed differences, the two-sided paired t test (n − 1 degrees of freedom, α = 0.05) and the
smallest difference the study could detect: (t₀.₉₇₅ + t₀.₈) × SD / √n with the SD of the per-seed differences the
study itself measures (power 0.8; sizing.py's rule, here on the paired differences). The dose check reads `fix16`
against `fix`. Each fit's Σ M (its DoF sample follows its seed) is printed beside it. ``--refits`` also prints the
`dof` fits beside the same recipe's earlier fits of the same seed (docs/results/far_term/heads_test): what refitting
one seed on this CPU changes.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from scipy import stats

from lit_dof.comparison.records import Cell, Report
from lit_dof.evaluation.stats import paired_seed_difference

ARMS = {  # arm: (report folder, row)
    "dof": ("quickstart_heads_C64", "quickstart_heads"),
    "fix": ("quickstart_heads_fix_C66", "quickstart_heads_fix"),
    "dof_head": ("quickstart_heads_dof_head_C68", "quickstart_heads_dof_head"),
    "fix16": ("quickstart_heads_fix_C16", "quickstart_heads_fix"),
}
QUESTIONS = [("fix", "dof"), ("dof_head", "dof"), ("fix16", "fix")]  # (arm, against)
EARLIER = Path(__file__).parents[1] / "far_term" / "heads_test" / "comparison.json"  # quickstart_heads, seeds 0-2


def _bucket(cell: Cell, name: str) -> float | None:
    return ((cell.by_position or {}).get("buckets", {}).get(name) or {}).get("ppl")


def _retrieval(task: str) -> Callable[[Cell], float | None]:
    return lambda c: c.retrieval[task].exact_match if task in c.retrieval else None


def _task(task: str) -> Callable[[Cell], float | None]:
    return lambda c: c.scores[task].value if task in c.scores else None


ENDPOINTS: dict[str, tuple[Callable[[Cell], float | None], bool]] = {  # name: (read, log ratio)
    "ppl 256-511, test split (primary)": (lambda c: _bucket(c, "256-511"), True),
    "ppl in-document 2048-4095, long documents (primary)": (lambda c: c.bucket_ppl("2048-4095"), True),
    "passkey exact match": (_retrieval("passkey"), False),
    "recall exact match": (_retrieval("recall"), False),
    "LogiQA acc_norm": (_task("logiqa"), False),
    "5-shot MMLU acc": (_task("mmlu_5shot"), False),
}


def arm_cells(reports: Path) -> dict[str, dict[int, Cell]]:
    """Each arm's student cells by seed, from its report (an arm without a report: no cells)."""
    out = {}
    for arm, (folder, row) in ARMS.items():
        path = reports / folder / "comparison.json"
        cells = Report.load(path).cells if path.is_file() else []
        out[arm] = {c.seed or 0: c for c in cells if c.row == row and c.kind != "control"}
    return out


def compare(arm: dict[int, Cell], against: dict[int, Cell], read, log: bool) -> str:
    """One endpoint: arm − against paired by seed (log ratio or points), the t test and the detectable effect."""
    a = {s: v for s, v in ((s, read(c)) for s, c in arm.items()) if v is not None}
    b = {s: v for s, v in ((s, read(c)) for s, c in against.items()) if v is not None}
    seeds = sorted(a.keys() & b.keys())
    if len(seeds) < 2:
        return f"{len(seeds)} paired seed(s): not yet comparable"
    result = paired_seed_difference(a, b, log=log)
    per_seed = [(math.log(a[s]) - math.log(b[s])) if log else a[s] - b[s] for s in seeds]
    n, sd = len(seeds), statistics.stdev(per_seed)
    p = 1.0 if sd == 0 else 2 * stats.t.sf(abs(result["difference"]) / result["stderr"], n - 1)
    detectable = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    if log:
        shown = f"ratio {result['ratio']:.4f} ± {result['ratio'] * result['stderr']:.4f} (per seed "
        shown += ", ".join(f"{math.exp(d):.4f}" for d in per_seed) + f"); detectable ratio {math.exp(detectable):.4f}"
    else:
        shown = f"{100 * result['difference']:+.1f} ± {100 * result['stderr']:.1f} points (per seed "
        shown += ", ".join(f"{100 * d:+.1f}" for d in per_seed) + f"); detectable {100 * detectable:.1f} points"
    return f"n = {n}, {shown}; paired t p = {p:.3f}" + (" (detected)" if p < 0.05 else " (no detectable difference)")


def refits(dof: dict[int, Cell]) -> None:
    """Print each `dof` fit beside the earlier fit of the same seed (:data:`EARLIER`): every endpoint both have."""
    earlier = {c.seed or 0: c for c in Report.load(EARLIER).cells if c.row == "quickstart_heads"}
    for seed in sorted(dof.keys() & earlier.keys()):
        now, then = dof[seed], earlier[seed]
        parts = [f"validation {now.fit.val_curve[-1][1]:.4f} / {then.fit.val_curve[-1][1]:.4f}"] if now.fit else []
        for name, (read, log) in ENDPOINTS.items():
            a, b = read(now), read(then)
            if a is not None and b is not None:
                parts.append(f"{name.split(',')[0]} {a:.4f} / {b:.4f}" if log else f"{name} {a:.3f} / {b:.3f}")
        print(f"refit of seed {seed} (this study / {EARLIER.parent.name}): " + "; ".join(parts))


def main() -> None:
    """Print each arm's fits (Σ M) and, per question, every endpoint's paired comparison over seeds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=Path(__file__).parent / "reports", help="the study's reports")
    parser.add_argument("--refits", action="store_true", help="the dof fits beside the earlier ones of their seed")
    args = parser.parse_args()
    cells = arm_cells(args.reports)
    for arm, by_seed in cells.items():
        fits = ", ".join(
            f"seed {s}: Σ M {c.fit.total_features:,.1f}" if c.fit and c.fit.total_features else f"seed {s}"
            for s, c in sorted(by_seed.items())
        )
        print(f"{arm} ({ARMS[arm][1]}, {ARMS[arm][0]}): {fits or 'no fit yet'}")
    if args.refits:
        refits(cells["dof"])
    for arm, against in QUESTIONS:
        print(f"\n{arm} − {against} (perplexity: {arm} / {against})")
        for name, (read, log) in ENDPOINTS.items():
            print(f"  {name}: {compare(cells[arm], cells[against], read, log)}")


if __name__ == "__main__":
    main()
