r"""Which task examples can a student get wrong? The share of each task's examples longer than a student's exact
positions (window + sinks), from the task records and a tokenizer alone — no model runs.

A sliding-window student attends exactly to its last ``window`` tokens and first ``sink_tokens``: an example whose
every scored request (context + continuation, as lm-eval tokenizes it) fits in window + sinks is scored exactly as
its teacher scores it. ``lit-dof eval`` records the same lengths per example (``tokens``, ``beyond_exact``).

Usage: python tools/task_lengths.py --tokenizer smollm2-135m-instruct --exact 68 --mmlu_per_subject 18 \
           [--tasks piqa mmlu_5shot] [--data_dir ../shared/data] [--output lengths.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from lit_dof.evaluation.retrieval import beyond_exact_share
from lit_dof.evaluation.task_data import EXTRA_TASKS, TASKS, load_task, request_texts
from lit_dof.io import atomic_write_json, portable


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="teacher alias, model folder or hub id")
    parser.add_argument("--exact", type=int, required=True, help="the student's window + sink tokens")
    parser.add_argument("--tasks", nargs="+", default=[*TASKS, *EXTRA_TASKS], choices=[*TASKS, *EXTRA_TASKS])
    parser.add_argument("--data_dir", default=os.environ.get("LIT_DOF_DATA"), help="task data (default $LIT_DOF_DATA)")
    parser.add_argument("--mmlu_per_subject", type=int, default=None, help="first N MMLU questions per subject")
    parser.add_argument("--output", help="JSON record of the lengths and shares")
    args = parser.parse_args(argv)
    from lit_dof.teacher.loading import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    result = {"command": portable([sys.executable, *sys.argv]), "exact": args.exact, "tasks": {}}
    for task in args.tasks:
        options = {"per_subject": args.mmlu_per_subject} if task.startswith("mmlu") else {}
        docs = load_task(task, args.data_dir, **options)
        lengths = [
            max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in request_texts(d)) for d in docs
        ]
        share = beyond_exact_share(lengths, args.exact)
        result["tasks"][task] = {
            "n": len(docs),
            "median": statistics.median(lengths),
            "max": max(lengths),
            "beyond_exact": share,
        }
        print(
            f"{task:14s} n {len(docs):5d}  median {statistics.median(lengths):6.0f}  max {max(lengths):5d}  "
            f"beyond {args.exact}: {share:.1%}"
        )
    if args.output:
        atomic_write_json(args.output, result)
    return result


if __name__ == "__main__":
    main()
