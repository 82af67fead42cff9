"""Prefix caching in the hybrid search: evaluations per minute with and without it, measured in one run.

    python scripts/bench_prefix_cache.py --items 48 --data_dir ../shared/data

A first search round scores every single-layer swap {c}; with the prefix cache, swap c runs only layers
c…L−1 from the teacher's cached hidden state. Prints both rates and their ratio (the cache's one-off cost,
one teacher forward with hidden states, is reported separately). Scores must agree exactly.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from lit_dof.teacher import DEFAULT_TEACHER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument("--task", default="arc_easy")
    parser.add_argument("--items", type=int, default=48, help="validation items scored per evaluation")
    parser.add_argument("--layers", type=int, nargs="*", default=None, help="candidate swaps (default: all)")
    parser.add_argument("--data_dir", default=os.environ.get("LIT_DOF_DATA"))
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from lit_dof.attention import LearnedPRF
    from lit_dof.evaluation import task_data
    from lit_dof.hybrid.scoring import HybridScorer, choice_batches
    from lit_dof.students import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, tokenizer = load_teacher(args.teacher)
    student = linearize(teacher, LearnedPRF, 64).eval()
    batches = choice_batches(task_data.load_task(args.task, args.data_dir)[: args.items], tokenizer)
    start = time.perf_counter()
    cached = HybridScorer(student, batches)
    cached.cache  # noqa: B018 — built now, so that its one-off cost is reported apart from the evaluations
    setup = time.perf_counter() - start
    plain = HybridScorer(student, batches, prefix_cache=False)
    layers = args.layers if args.layers is not None else list(range(cached.num_layers))
    scores = {}
    for name, scorer in (("without cache", plain), ("with cache", cached)):
        scores[name] = [scorer(frozenset({c})) for c in layers]
    assert scores["with cache"] == scores["without cache"], "prefix caching changed a score"
    rate = {name: 60 * s.evaluations / s.seconds for name, s in (("without cache", plain), ("with cache", cached))}
    print(
        f"{args.teacher}, {args.task}: {len(layers)} single-layer swaps × {args.items} items, "
        f"{torch.get_num_threads()} threads"
    )
    for name, value in rate.items():
        print(f"  {name:14s} {value:7.2f} evaluations/min")
    print(f"  speed-up {rate['with cache'] / rate['without cache']:.2f}× (cache built once in {setup:.1f} s)")


if __name__ == "__main__":
    main()
