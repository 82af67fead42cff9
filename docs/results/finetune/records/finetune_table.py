"""The fine-tuning table of docs/results/finetune: per task, each model's report accuracy untuned and fine-tuned, the
paired differences over the report documents and the share of Fix's gap to the teacher that DoF closes; the teacher's
learning-rate grid on the choose split.

    python docs/results/finetune/records/finetune_table.py [CELLS]

CELLS: the study's output folder (``runs/finetune``; its ``C64/<row>/finetune/<task>.json`` and
``finetune_lr/<task>/lr*/result.json``); without it, the committed records here (``<row>_<task>.json``,
``teacher_<task>_lr<lr>.json``).
"""

import json
import sys
from pathlib import Path

from lit_dof.evaluation.stats import paired_difference

HERE = Path(__file__).parent
ROWS = ("teacher", "fix", "dof")


def load(cells: Path | None, row: str, task: str) -> dict | None:
    """The ``finetune/<task>.json`` of ``row`` (a run folder or the committed copy); ``None`` when not run yet."""
    path = cells / "C64" / row / "finetune" / f"{task}.json" if cells else HERE / f"{row}_{task}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def grid(cells: Path | None, task: str) -> dict[str, dict]:
    """The teacher's runs of the learning-rate grid by learning rate (as written, e.g. ``3e-05``)."""
    paths = (cells / "finetune_lr" / task).glob("lr*/result.json") if cells else HERE.glob(f"teacher_{task}_lr*.json")
    runs = {}
    for path in paths:
        lr = path.parent.name[2:] if cells else path.stem.rsplit("_lr", 1)[1]
        runs[lr] = json.loads(path.read_text())
    return dict(sorted(runs.items(), key=lambda item: float(item[0])))


def correct(record: dict, which: str) -> list[int]:
    """Per report document, 1 if right: at the chosen epoch (``"tuned"``) or untuned (``"before"``)."""
    entry = record["chosen"] if which == "tuned" else record["before"]
    return [int(c) for c in entry["report"]["correct"]]


def main(cells: Path | None) -> None:
    """Print the table of each task from ``cells`` (a run folder) or, with ``None``, from the committed records."""
    for task in ("arc_easy", "piqa"):
        print(f"== {task}")
        for lr, run in grid(cells, task).items():
            chosen = run["chosen"]
            print(
                f"  teacher lr {lr}: choose {run['choose_score']:.3f} at epoch {chosen['epoch']} "
                f"(untuned {run['before']['choose']['acc']:.3f}); {run['wall_seconds'] / 60:.0f} min"
            )
        records = {row: load(cells, row, task) for row in ROWS}
        for row, record in records.items():
            if record is None:
                print(f"  {row}: not run yet")
                continue
            n = record["chosen"]["report"]["examples"]
            tuned, before = correct(record, "tuned"), correct(record, "before")
            gain, se, _ = paired_difference(tuned, before)
            print(
                f"  {row}: report {record['score']:.3f} (n {n}, epoch {record['chosen']['epoch']}, lr "
                f"{record['lr']:g}) untuned {record['zero_shot']:.3f}; tuned - untuned {gain * 100:+.1f} ± "
                f"{se * 100:.1f} points; {record['wall_seconds'] / 60:.0f} min"
            )
        if all(records.values()):
            teacher, fix, dof = (correct(records[row], "tuned") for row in ROWS)
            for name, (a, b) in {"dof - fix": (dof, fix), "teacher - fix": (teacher, fix),
                                 "teacher - dof": (teacher, dof)}.items():  # fmt: skip
                mean, se, n = paired_difference(a, b)
                print(f"  {name}: {mean * 100:+.1f} ± {se * 100:.1f} points (paired, {n} documents)")
            gap, gap_se, _ = paired_difference(teacher, fix)
            share = paired_difference(dof, fix)[0] / gap if gap > 2 * gap_se else None
            print(
                "  share of Fix's gap DoF closes: "
                + (f"{share:.0%}" if share is not None else "not stated (gap ≤ 2 SE)")
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
