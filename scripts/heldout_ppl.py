r"""Held-out perplexity of one model — the ``ppl`` stage of ``lit-dof compare`` on any teacher or exported student —
and its ratio to other models' records, paired block by block.

Measures the sliding-window perplexity (window 512, stride 256) of the first ``--tokens`` tokens of the corpus's
held-out documents and the perplexity by position in blocks of 512 tokens
(:func:`lit_dof.evaluation.perplexity.heldout_perplexity`), or reads such a record back (a ``.json`` as MODEL).
With ``--contexts 512 2048 4096 8192`` it measures the long-context record instead (the ``long`` stage,
:func:`~lit_dof.evaluation.perplexity.long_context_perplexity`); such a record is paired context by context.
Then, for every ``--against`` record measured on the same tokens (a cell's ``ppl.json``, the records in
docs/results), it prints the ratio of the sliding-window perplexities and the paired ratio of the block
perplexities ± its standard error over blocks (:func:`~lit_dof.evaluation.perplexity.paired_perplexity_ratio`),
for every position and per bucket.

Usage: python scripts/heldout_ppl.py runs/quickstart/version_0/student --corpus <corpus> \
           --against docs/results/sliding_window/teacher_ppl.json docs/results/sliding_window/swa_sink_ppl.json \
           --output quickstart_ppl.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from lit_dof.evaluation.perplexity import heldout_perplexity, long_context_perplexity, paired_perplexity_ratio
from lit_dof.io import atomic_write_json


def measure(model_source: str, corpus: str, tokens: int, device: str, contexts: list[int] | None = None) -> dict:
    """The held-out record of ``model_source`` (a student directory or a teacher source), timed; with
    ``contexts``, the long-context record instead (compare's ``long.json``)."""
    from lit_dof.evaluation.loading import load_model

    model, tokenizer = load_model(model_source, device=device)
    start = time.time()
    if contexts:
        result = long_context_perplexity(model, tokenizer, corpus, contexts, tokens)
    else:
        result = heldout_perplexity(model, tokenizer, corpus, max_tokens=tokens)
    return {**result, "model": model_source, "seconds": time.time() - start, "device": device}


def ratios(record: dict, reference: dict) -> dict[str, dict]:
    """Paired ratios of ``record`` to ``reference``: ``"sliding"`` (plain ratio of the sliding-window
    perplexities), ``"all"`` and each bucket (``paired_perplexity_ratio``, with ``stderr`` of the ratio).

    Raises:
        ValueError: the two records do not score the same blocks.
    """
    if "contexts" in record:  # a long-context record (compare's long.json): pair each context's blocks
        return {
            f"{context}:{name}": ratio
            for context, blocks in record["contexts"].items()
            for name, ratio in _bucket_ratios(blocks, reference["contexts"][context]).items()
        }
    return {
        "sliding": {"ratio": record["ppl"] / reference["ppl"]},
        **_bucket_ratios(record["by_position"], reference["by_position"]),
    }


def _bucket_ratios(blocks: dict, reference: dict) -> dict[str, dict]:
    out = {}
    for bucket in [None, *blocks["buckets"]]:
        paired = paired_perplexity_ratio(blocks, reference, bucket)
        out[bucket or "all"] = {**paired, "stderr": paired["ratio"] * paired["stderr_log"]}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="student directory, teacher source, or a held-out record (.json) to read")
    parser.add_argument("--corpus", default=os.environ.get("LIT_DOF_CORPUS"), help="default: $LIT_DOF_CORPUS")
    parser.add_argument("--against", nargs="*", default=[], help="records of other models on the same corpus")
    parser.add_argument("--output", help="write the measured record here (JSON, atomic)")
    parser.add_argument("--tokens", type=int, default=16384, help="held-out tokens scored (the comparison's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contexts", type=int, nargs="*", help="measure perplexity by position at these block lengths")
    args = parser.parse_args(argv)
    references = {path: json.loads(Path(path).read_text()) for path in args.against}  # bad paths fail before work
    if args.model.endswith(".json"):
        record = json.loads(Path(args.model).read_text())
    elif not args.corpus:
        parser.error("no corpus: pass --corpus or set LIT_DOF_CORPUS")
    else:
        record = measure(args.model, args.corpus, args.tokens, args.device, args.contexts)
        if args.output:
            atomic_write_json(args.output, record)
    if "contexts" in record:
        print(
            f"{args.model}: perplexity "
            + ", ".join(f"{c} tokens {r['ppl']:.3f}" for c, r in record["contexts"].items())
        )
    else:
        print(f"{args.model}: sliding-window perplexity {record['ppl']:.3f} ({record['tokens']} tokens)")
    found = {}
    for path, reference in references.items():
        try:
            found[path] = ratios(record, reference)
        except ValueError as error:
            sys.exit(f"{path}: {error}")
        cells = [f"{name} {r['ratio']:.3f}" + (f" ± {r['stderr']:.3f}" if "stderr" in r else "")
                 for name, r in found[path].items()]  # fmt: skip  # packed comprehension
        print(f"  / {Path(path).name}: " + " | ".join(cells))
    return {"record": record, "ratios": found}


if __name__ == "__main__":
    main()
