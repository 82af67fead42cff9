r"""Held-out perplexity of one model — the ``ppl`` stage of ``lit-dof compare`` on any teacher or exported student —
and its ratio to other models' records, paired block by block.

Measures the sliding-window perplexity (window 512, stride 256) of the first ``--tokens`` tokens of one split of
the corpus — ``--split test`` (the default), or ``validation`` for model selection and for the records measured
before the test split existed (docs/results) — and the perplexity by position in blocks of 512 tokens
(:func:`lit_dof.evaluation.position_perplexity.heldout_perplexity`), or reads such a record back (a ``.json`` as MODEL).
With ``--contexts 512 2048 4096 8192`` it measures the long-context record instead (the ``long`` stage,
:func:`~lit_dof.evaluation.position_perplexity.long_context_perplexity`); such a record is paired context by context.
With ``--long_documents`` it measures the long-document test set by in-document position
(:func:`~lit_dof.evaluation.long_documents.long_document_perplexity`; ``--max_documents``, ``--max_tokens``); such a
record is paired document by document. Then, for every ``--against`` record measured on the same tokens and split
(a cell's ``ppl.json``, the records in docs/results), it prints the ratio of the sliding-window perplexities and
the paired ratio of the block (document) perplexities ± its standard error over blocks (documents)
(:func:`~lit_dof.evaluation.position_perplexity.paired_perplexity_ratio`), for every position and per bucket.

Usage: python scripts/heldout_ppl.py runs/quickstart/version_0/student --corpus <corpus> --split validation \
           --against docs/results/sliding_window/records/teacher_ppl.json \
           docs/results/sliding_window/records/swa_sink_ppl.json \
           --output quickstart_ppl.json
       python scripts/heldout_ppl.py smollm2-135m-instruct --corpus <corpus> --long_documents --output teacher_ld.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from lit_dof.data.splits import recorded_split
from lit_dof.evaluation.long_documents import long_document_perplexity
from lit_dof.evaluation.position_perplexity import bucket_ratios, heldout_perplexity, long_context_perplexity
from lit_dof.io import atomic_write_json


def measure(model_source: str, corpus: str, tokens: int, device: str, contexts: list[int] | None = None,
            split: str = "test", long_documents: dict | None = None) -> dict:  # fmt: skip  # packed signature
    """The held-out record of ``model_source`` (a student directory or a teacher source) on ``split``, timed;
    with ``contexts``, the long-context record instead (compare's ``long.json``); with ``long_documents`` (the
    keyword arguments of :func:`long_document_perplexity`, e.g. ``{"max_documents": 20}``), the long-document
    record (compare's ``long_documents.json``)."""
    from lit_dof.evaluation.loading import load_model

    model, tokenizer = load_model(model_source, device=device)
    start = time.time()
    if long_documents is not None:
        result = long_document_perplexity(model, tokenizer, corpus, **long_documents)
    elif contexts:
        result = long_context_perplexity(model, tokenizer, corpus, contexts, tokens, split=split)
    else:
        result = heldout_perplexity(model, tokenizer, corpus, max_tokens=tokens, split=split)
    return {**result, "model": model_source, "seconds": time.time() - start, "device": device}


def ratios(record: dict, reference: dict) -> dict[str, dict]:
    """Paired ratios of ``record`` to ``reference``: ``"sliding"`` (plain ratio of the sliding-window
    perplexities), ``"all"`` and each bucket (``paired_perplexity_ratio``, with ``stderr`` of the ratio).

    Raises:
        ValueError: the two records measured different splits (a record without ``split`` measured validation),
            or do not score the same blocks.
    """
    splits = [recorded_split(r) for r in (record, reference)]
    if splits[0] != splits[1]:
        raise ValueError(f"the records measured different splits ({splits[0]} and {splits[1]}): measure both on "
                         "one split (--split)")  # fmt: skip  # one message
    if record.get("kind") == "long_documents":  # whole documents: pair document by document
        return bucket_ratios(record, reference)
    if "contexts" in record:  # a long-context record (compare's long.json): pair each context's blocks
        return {
            f"{context}:{name}": ratio
            for context, blocks in record["contexts"].items()
            for name, ratio in bucket_ratios(blocks, reference["contexts"][context]).items()
        }
    return {
        "sliding": {"ratio": record["ppl"] / reference["ppl"]},
        **bucket_ratios(record["by_position"], reference["by_position"]),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="student directory, teacher source, or a held-out record (.json) to read")
    parser.add_argument("--corpus", default=os.environ.get("LIT_DOF_CORPUS"), help="default: $LIT_DOF_CORPUS")
    parser.add_argument("--against", nargs="*", default=[], help="records of other models on the same corpus")
    parser.add_argument("--output", help="write the measured record here (JSON, atomic)")
    parser.add_argument("--tokens", type=int, default=16384, help="held-out tokens scored (the comparison's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contexts", type=int, nargs="*", help="measure perplexity by position at these block lengths")
    parser.add_argument("--split", default="test", choices=["test", "validation"],
                        help="the documents scored: test (default) or validation (model selection; the records "
                        "measured before the test split)")  # fmt: skip  # packed args
    parser.add_argument("--long_documents", action="store_true",
                        help="measure the long-document test set by in-document position instead")  # fmt: skip
    parser.add_argument("--max_documents", type=int, help="with --long_documents: the first this many documents")
    parser.add_argument("--max_tokens", type=int, help="with --long_documents: tokens per document (default: the "
                        "model's max positions)")  # fmt: skip  # packed args
    args = parser.parse_args(argv)
    if args.long_documents and args.contexts:
        parser.error("--long_documents and --contexts measure different records: pass one")
    references = {path: json.loads(Path(path).read_text()) for path in args.against}  # bad paths fail before work
    if args.model.endswith(".json"):
        record = json.loads(Path(args.model).read_text())
    elif not args.corpus:
        parser.error("no corpus: pass --corpus or set LIT_DOF_CORPUS")
    else:
        command = [sys.executable, "scripts/heldout_ppl.py", *(sys.argv[1:] if argv is None else argv)]
        long_documents = {"max_documents": args.max_documents, "max_tokens": args.max_tokens,
                          "command": command} if args.long_documents else None  # fmt: skip  # compact dict
        record = measure(args.model, args.corpus, args.tokens, args.device, args.contexts, args.split, long_documents)
        if args.output:
            atomic_write_json(args.output, record)
    if record.get("kind") == "long_documents":
        print(
            f"{args.model}: {record['documents']} long documents, perplexity "
            + ", ".join(f"{name} {b['ppl']:.3f}" for name, b in record["buckets"].items() if b["ppl"])
        )
    elif "contexts" in record:
        print(
            f"{args.model}: perplexity "
            + ", ".join(f"{c} tokens {r['ppl']:.3f}" for c, r in record["contexts"].items())
        )
    else:
        split = recorded_split(record)
        print(f"{args.model}: sliding-window perplexity {record['ppl']:.3f} ({record['tokens']} tokens, {split} split)")
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
