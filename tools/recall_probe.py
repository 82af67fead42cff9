"""Recall on natural text: do a student and its controls retrieve a made-up fact from far back in held-out prose?

Scores each model on the hybrid search's recall items (lit_dof.hybrid.recall_items: one fact — "The locker code of
Alvarez is 48213." — at a depth of 10–90% in a block of the corpus's *validation* documents, its question and answer
at the end; teacher-forced exact match of the answer's tokens), beside the student's controls (a) and (b)
(lit_dof.evaluation.controls) and the teacher. The haystack is natural text, not the passkey's repeated filler, so it
tests whether a far cache's score, not a repetitive haystack, finds the fact (issue #45, item 3). Validation only:
it may be used to choose.

Usage: python tools/recall_probe.py STUDENT [STUDENT ...] [--corpus PATH] [--block 2048] [--items 20] [--skip 0]
    [--no_controls [--teacher]]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from lit_dof.evaluation.controls import control_models
from lit_dof.hybrid.recall_items import recall_blocks, recalled
from lit_dof.students import load_student
from lit_dof.teacher.loading import load_teacher, load_tokenizer


def recall(model, items: list[dict]) -> list[bool]:
    """Whether ``model`` recalls each item (one forward per item)."""
    with torch.no_grad():
        return [recalled(model(item["input_ids"]).logits, item) for item in items]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("students", nargs="+", help="student folders (the controls come from the first)")
    parser.add_argument("--corpus", default=os.environ.get("LIT_DOF_CORPUS"), help="corpus (its validation docs)")
    parser.add_argument("--block", type=int, nargs="+", default=[2048], help="tokens per item")
    parser.add_argument("--items", type=int, default=20, help="items per block length")
    parser.add_argument("--skip", type=int, default=0, help="blocks passed over first (e.g. a search's own items)")
    parser.add_argument("--no_controls", action="store_true", help="score the students only (and --teacher)")
    parser.add_argument("--teacher", action="store_true", help="with --no_controls: score the teacher too")
    parser.add_argument("--json", help="write the per-item results here")
    args = parser.parse_args(argv)
    first = load_student(args.students[0]).eval()
    tokenizer = load_tokenizer(args.students[0])
    models = {}
    if args.teacher or not args.no_controls:
        models["teacher"] = load_teacher(first.config.teacher)[0].eval()
    if not args.no_controls:
        controls = control_models(first, models["teacher"], tail=False)
        models |= {"window_sinks": controls["window_sinks"], "equal_state": controls["equal_state"]}
    for path in args.students:
        models[path] = first if path == args.students[0] else load_student(path).eval()
    results = {}
    for block in args.block:
        _, _, items, where = recall_blocks(args.corpus, tokenizer, block, 0, args.items, skip=args.skip)
        print(f"{where}; {len(items)} items")
        for name, model in models.items():
            start = time.time()
            hits = recall(model, items)
            results[f"{name}@{block}"] = hits
            print(f"  {name}: {sum(hits)}/{len(hits)}  ({time.time() - start:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
