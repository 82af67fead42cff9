r"""Seven-task scores of one model against others, paired example by example.

Each record is a ``lit-dof eval --output`` file or one cell of a ``lit-dof compare`` report, written
``comparison.json:ROW`` (``comparison.json:ROW@C`` when the report has several budgets). The score of a task is
its primary metric (``lit_dof.comparison.rows.PRIMARY_METRIC``: acc_norm where lm-eval has it, else acc), so the
numbers are those of the comparison's table. For every ``--against`` record it prints, per task and for the
average over the tasks both scored, the difference in points ± its paired standard error
(:func:`lit_dof.evaluation.stats.paired_task_differences`); the examples must be the same (same ``--limit``,
``--mmlu_per_subject`` and data), which the count of examples per task checks.

Usage: python scripts/paired_tasks.py quickstart_eval.json \
           --against docs/results/sliding_window/comparison.json:teacher
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lit_dof.comparison.collect import decode_items
from lit_dof.comparison.rows import PRIMARY_METRIC
from lit_dof.evaluation.stats import paired_task_differences


def load_items(spec: str) -> dict[str, list[float]]:
    """Per task, the per-example scores of the primary metric in the record ``spec`` names.

    Raises:
        ValueError: a report cell that is missing or ambiguous (the message lists the cells), or a record with no
            per-example scores.
    """
    path, _, cell = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    record = json.loads(Path(path).read_text())
    if "cells" in record:
        row, _, budget = cell.partition("@")
        found = [c for c in record["cells"] if c["row"] == row and (not budget or c["budget"] == int(budget))]
        if len(found) != 1:
            cells = sorted(f"{c['row']}@{c['budget']}" for c in record["cells"])
            raise ValueError(f"{spec}: {len(found)} cells match; write {path}:ROW or ROW@C, one of {cells}")
        items = {task: decode_items(values) for task, values in found[0].get("items", {}).items()}
    else:
        items = {task: entry["items"][PRIMARY_METRIC[task]] for task, entry in record["tasks"].items()
                 if entry.get("items", {}).get(PRIMARY_METRIC.get(task, ""))}  # fmt: skip  # one comprehension
    if not items:
        raise ValueError(f"{spec} has no per-example scores (an eval record written by lit-dof eval --output)")
    return items


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="eval record (.json) or comparison.json:ROW")
    parser.add_argument("--against", nargs="+", required=True, help="records to pair with, same forms")
    args = parser.parse_args(argv)
    items = load_items(args.record)
    out = {}
    for spec in args.against:
        reference = load_items(spec)
        tasks = [task for task in PRIMARY_METRIC if task in items and task in reference]
        per_task, average = paired_task_differences(items, reference, tasks)
        unpaired = sorted(set(tasks) - set(per_task))
        if unpaired:
            raise ValueError(f"{spec}: different numbers of examples on {unpaired}; use the same --limit and data")
        print(f"{args.record} - {spec}, points (± paired SE; n examples):")
        for task in tasks:
            mine, theirs = (sum(x[task]) / len(x[task]) for x in (items, reference))
            d = per_task[task]
            print(f"  {task:14s} {mine:.4f} vs {theirs:.4f}: {100 * d['difference']:+6.2f} ± {100 * d['stderr']:.2f} "
                  f"(n {d['n']})")  # fmt: skip  # one line
        means = [sum(sum(x[t]) / len(x[t]) for t in tasks) / len(tasks) for x in (items, reference)]
        print(f"  {'average':14s} {means[0]:.4f} vs {means[1]:.4f}: {100 * average['difference']:+6.2f} ± "
              f"{100 * average['stderr']:.2f} ({len(tasks)} tasks)")  # fmt: skip  # one line
        out[spec] = {"tasks": per_task, "average": {**average, "scores": means}}
    return out


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:
        sys.exit(f"paired_tasks.py: {error}")
