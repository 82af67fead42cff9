"""Write ``configs/README.md``: one row per shipped recipe — what it is, its fit's wall time on 2 CPU cores, its planned
peak host memory (``lit-dof plan``), its held-out perplexity against the teacher's and its decode state — the measured
columns read from the committed records in docs/results (issue #44, item 3); "–" where nothing was measured.

Run from the repository root (the plan column runs ``lit-dof plan`` once per recipe, ≈ 20 s each on 2 cores; with
``--no-plan`` it is read back from the current configs/README.md, with ``--plan`` for the named recipes only):

    python tools/configs_readme.py [--no-plan | --plan base methods/fix ...]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from lit_dof.comparison.records import Report
from lit_dof.comparison.rows import ROWS
from lit_dof.config_files import config_description, shipped_configs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
README = ROOT / "configs" / "README.md"

REPORTS = ("far_term/heads_test", "test_split", "sliding_window", "comparison")
"""The committed reports a recipe's measures come from, first match wins: the test split over seeds (the shipped
quickstart's, then the constant-state recipe's), then the sliding-window and the pure linear comparisons (both on
the validation split, one fit, recipes of their day)."""

BUILDING_BLOCKS = ("models/", "trainer/", "compare/")
"""Shipped files that are not recipes: a teacher, a trainer, the comparison's rows."""


@dataclass
class Measured:
    """A recipe's measures from one committed report (``None``: not there)."""

    wall_minutes: float | None
    ratio: float | None
    state_mib: float | None
    source: str


COMPOSED_WITH = {"hybrid/window_twins": ("methods/swa_sink_linear_decay_norope",)}
"""Files composed over more than the base: the window twins are the quickstart's attention with no tail."""


def composition(name: str) -> list[str]:
    """The ``--config`` files of a recipe: a method or hybrid file composes over configs/base.yaml."""
    if not name.startswith(("methods/", "hybrid/")):
        return [f"configs/{name}.yaml"]
    return ["configs/base.yaml", *(f"configs/{c}.yaml" for c in COMPOSED_WITH.get(name, ())), f"configs/{name}.yaml"]


def row_of(name: str) -> str | None:
    """The comparison row that fits this recipe as shipped: its one method file and no extra argument but those of
    an untrained row (one step: nothing to train)."""
    if name in ("quickstart", "base"):  # the base alone composes what the dof row does (dof.yaml restates it)
        return "dof" if name == "base" else "quickstart_heads"  # tests/test_config_files.py: its composition
    untrained = ROWS["performer"].args
    found = [
        r.name
        for r in ROWS.values()
        if r.configs == (f"{name}.yaml",) and r.args in ((), untrained) and r.kind == "student"
    ]
    return found[0] if found else None


def summary(name: str) -> str:
    """The first sentence of a config's leading comment (its description), for a table cell."""
    lines = []
    for line in (ROOT / "configs" / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines) or config_description(name)
    sentence = re.split(r"(?<=[.!?])(?<!al\.)\s", text, maxsplit=1)[0].replace("|", "/")
    if len(sentence) <= 200:
        return sentence
    cut = max(sentence.rfind(mark, 0, 200) for mark in (", ", "; ", ": ", " — "))
    return sentence[: cut if cut > 0 else 200] + " …"


def measured(row: str) -> Measured | None:
    """The row's measures from the first committed report that has it and its teacher: mean over its seeds."""
    for folder in REPORTS:
        report = Report.load(RESULTS / folder / "comparison.json")
        cells = [c for c in report.cells if c.row == row]
        teacher = report.teacher
        if not cells or teacher is None or teacher.ppl is None:
            continue
        walls = [c.fit.wall_seconds / 60 for c in cells if c.fit and c.fit.wall_seconds]
        ratios = [c.ppl / teacher.ppl for c in cells if c.ppl is not None]
        states = [c.state.bytes / 2**20 for c in cells if c.state]
        split = "test" if "test split" in (cells[0].ppl_setting or "") else "validation"
        fits = f"{len(cells)} fit{'s' if len(cells) > 1 else ''}"
        return Measured(
            statistics.mean(walls) if walls else None,
            statistics.mean(ratios) if ratios else None,
            statistics.mean(states) if states else None,
            f"[{folder}](../docs/results/{folder}/comparison.md) ({split} split, {fits})",
        )
    return None


def planned_peak(name: str) -> str:
    """``lit-dof plan``'s peak host memory of the recipe (GiB), or "–" when it plans nothing (a capture or a
    fine-tuning recipe)."""
    args = [arg for config in composition(name) for arg in ("--config", config)]
    run = subprocess.run(["lit-dof", "plan", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    match = re.search(r"plan peak_gpu_gib=[\d.]+ host_gib=([\d.]+)", run.stdout)
    return f"{float(match.group(1)):.1f} GiB" if match else "–"


def earlier_peaks() -> dict[str, str]:
    """The planned-peak column of the current configs/README.md, by recipe."""
    if not README.is_file():
        return {}
    rows = re.findall(r"^\| `([^`]+)` \|(?:[^|]*\|){2}([^|]*)\|", README.read_text(), flags=re.M)
    return {name: peak.strip() for name, peak in rows}


def table(plan: bool | Collection[str]) -> list[str]:
    """The recipe table's markdown lines.

    Args:
        plan: ``True`` runs ``lit-dof plan`` for every recipe, ``False`` keeps the current file's planned-peak
            column, a collection of recipe names plans those and keeps the others'.
    """
    peaks = {} if plan is True else earlier_peaks()
    lines = [
        "| recipe | what it is | fit wall, 2 CPU cores | planned peak host memory | held-out ppl / teacher's "
        "| decode state at 512 tokens | measured in |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in shipped_configs():
        if name.startswith(BUILDING_BLOCKS):
            continue
        row = row_of(name)
        found = measured(row) if row else None
        peak = planned_peak(name) if plan is True or (plan and name in plan) else peaks.get(name, "–")
        cells = [
            f"`{name}`",
            summary(name),
            f"{found.wall_minutes:.0f} min" if found and found.wall_minutes else "–",
            peak,
            f"{found.ratio:.2f} ×" if found and found.ratio else "–",
            f"{found.state_mib:.2f} MiB" if found and found.state_mib else "–",
            found.source if found else "–",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


HEADER = """# Shipped configs

Run a recipe with `lit-dof fit --config configs/<recipe>.yaml`; a `methods/` or `hybrid/` file composes over the
shared setup `configs/base.yaml`, which chooses no attention (alone: pure linear, learned PRF, DoF dims, no LoRA):
`--config configs/base.yaml --config configs/methods/fix.yaml`. Method files add one choice each and compose with
one another; the quickstart is base + `methods/swa_sink_linear_decay_norope` + `methods/lora` + exact KV heads
(its `exact_heads`: the teacher's retrieval heads, 20% of its KV heads found at fit start), written out whole.
`lit-dof configs list|show|copy` reads them from an installed package. Generated by `python tools/configs_readme.py`
from the committed records:

- **fit wall**: the recorded fit's wall time (its attempts summed) on the 2-core CPU VM that ran it, often shared
  with other work — an order of magnitude, not a benchmark (the quickstart's: the mean of its three fits, one of
  which shared the VM with a test run); records of older recipes ran their schedule of the day (each report's README
  says which).
- **planned peak host memory**: `lit-dof plan`'s estimate for the recipe as shipped (the teacher built on the meta
  device; docs/scale.md compares it with measured peaks).
- **held-out ppl / teacher's**: sliding-window perplexity (window 512, stride 256) over the teacher's on the same
  tokens, mean over the fits; the split and the number of fits are in the last column. Recipes not fitted as
  shipped (a control's own row, a bank of twins, a capture, a fine-tuning protocol) show "–".
- **decode state**: what generation keeps per sequence after 512 tokens (the teacher's fp32 KV cache: {teacher});
  constant from there on but for the quickstart's exact heads, whose KV cache grows (20% of the teacher's per token).

"""

FOOTER = """
Building blocks, composed with a recipe rather than run alone: `models/` (a teacher and its head size C),
`trainer/` (CPU, one GPU, DDP, FSDP2, W&B logging) and `compare/rows.yaml` (the rows of `lit-dof compare`).
"""


def main(argv: list[str] | None = None) -> None:
    """Write configs/README.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--no-plan", action="store_true", help="keep the planned-peak column of the current file")
    choice.add_argument("--plan", nargs="+", metavar="RECIPE", help="plan these recipes only, keep the others' peaks")
    args = parser.parse_args(argv)
    teacher = Report.load(RESULTS / REPORTS[0] / "comparison.json").teacher.state
    header = HEADER.format(teacher=f"{teacher.bytes / 2**20:.2f} MiB")
    plan = set(args.plan) if args.plan else not args.no_plan
    README.write_text(header + "\n".join(table(plan=plan)) + "\n" + FOOTER)
    print(f"wrote {README.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
