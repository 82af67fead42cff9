"""Algorithm 1 on a teacher: capture q/k on local text, per-head DoF, allocation → dof.json.

Example (the embedded SmolLM2-135M on the shared Wikipedia, automatic λ):
    python scripts/dof_report.py --teacher smollm2-135m-instruct --lam auto --out dof.json
Prints one line per λ rule and the per-layer dims; writes the report of the first --lam.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from lit_dof.data.corpus import iter_documents
from lit_dof.dof import collect_samples, dof_report
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.loading import load_teacher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument(
        "--corpus",
        default=os.path.join(
            os.environ.get("LIT_DOF_DATA", "../shared/data"), "wikipedia/enwiki_wikiextractor_AA.txt.gz"
        ),
    )
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--num-samples", type=int, default=1024)
    parser.add_argument("--pooling", default="query_head", choices=["kv_head", "query_head"])
    parser.add_argument(
        "--lam",
        nargs="+",
        default=["auto", "2**-4", "2**64", "trace:2**-8"],
        help="λ rules: 'auto', an absolute value (python expression), or 'trace:VALUE' / 'max_eigenvalue:VALUE'",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    model, tok = load_teacher(args.teacher)
    docs = (d for d in iter_documents(args.corpus) if len(d) > 4 * args.seq_len)
    ids = []
    for doc in docs:
        t = tok(doc, return_tensors="pt").input_ids[0]
        if t.numel() >= args.seq_len:
            ids.append(t[: args.seq_len])
        if len(ids) == args.sequences:
            break
    batches = [torch.stack(ids[i : i + 4]) for i in range(0, len(ids), 4)]
    t0 = time.perf_counter()
    reservoir, tokens = collect_samples(model, batches, args.num_samples, pooling=args.pooling)
    print(f"captured {tokens} tokens in {time.perf_counter() - t0:.1f} s")
    first = None
    for rule in args.lam:
        rel, _, value = rule.rpartition(":")
        lam = "auto" if value == "auto" else float(eval(value, {}))  # noqa: S307 - CLI arithmetic like 2**64
        t0 = time.perf_counter()
        report = dof_report(
            model, reservoir, tokens, lam, relative_to=rel or None, pooling=args.pooling, name=args.teacher
        )
        dims = report.feature_dims("dof")
        lay = [x for x in report.layer_dof if x is not None]
        print(
            f"lam={rule} (abs {report.lam:.3g}, log2 {torch.tensor(report.lam).log2().item():.1f}): "
            f"layer DoF {min(lay):.1f}..{max(lay):.1f}, dof dims {min(dims)}..{max(dims)} "
            f"(spread {max(dims) - min(dims)}), warnings={len(report.warnings)}, {time.perf_counter() - t0:.1f} s"
        )
        print("  dims:", dims)
        first = first or report
    if args.out:
        first.save(args.out)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
