r"""Documents, characters and tokens of each split of a corpus (:mod:`lit_dof.data.splits`): training, validation,
test and the long-document test set; with a tokenizer, the long documents' token lengths too.

Usage: python scripts/split_sizes.py --corpus <corpus> --tokenizer smollm2-135m-instruct --output sizes.json

Tokens are counted without special tokens or EOS (the training stream adds one EOS per document). Tokenising a
whole Wikipedia file takes minutes on a CPU; without ``--tokenizer`` only documents and characters are counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from lit_dof.data.corpus import is_heldout, iter_documents
from lit_dof.data.splits import SPLITS, document_split, split_rule
from lit_dof.io import atomic_write_json, library_versions, portable


def split_sizes(corpus: str, tokenizer=None, val_every: int = 100, long_limit: int = 8192) -> dict:
    """Count each split of a local corpus.

    Args:
        corpus: a local corpus file.
        tokenizer: a transformers tokenizer, or ``None`` to count documents and characters only.
        val_every: the validation modulus.
        long_limit: the tokens a long document is scored up to (a model's max positions), for the
            ``scored_tokens`` of the long set.

    Returns:
        ``{split: {"documents", "characters", "tokens"?, "rule"}}``; the long split also has ``"lengths"``
        (min / median / max tokens), ``"at_least_4096"`` and ``"scored_tokens"`` (Σ min(length, long_limit)).
    """
    sizes = {split: {"documents": 0, "characters": 0, "rule": split_rule(split, val_every)} for split in SPLITS}
    lengths = []
    for i, doc in enumerate(iter_documents(corpus)):
        entry = sizes[document_split(doc, is_heldout(i, val_every))]
        entry["documents"] += 1
        entry["characters"] += len(doc)
        if tokenizer is not None:
            count = len(tokenizer(doc, add_special_tokens=False)["input_ids"])
            entry["tokens"] = entry.get("tokens", 0) + count
            if entry is sizes["long"]:
                lengths.append(count)
    if lengths:
        sizes["long"].update(lengths={"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
                             at_least_4096=sum(n >= 4096 for n in lengths),
                             scored_tokens=sum(min(n, long_limit) for n in lengths))  # fmt: skip  # packed args
    return sizes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=os.environ.get("LIT_DOF_CORPUS"), help="default: $LIT_DOF_CORPUS")
    parser.add_argument("--tokenizer", help="a teacher source whose tokenizer counts tokens (alias, folder, hub id)")
    parser.add_argument("--val_every", type=int, default=100)
    parser.add_argument("--long_limit", type=int, default=8192, help="tokens a long document is scored up to")
    parser.add_argument("--output", help="write the counts here (JSON, atomic)")
    args = parser.parse_args(argv)
    if not args.corpus:
        parser.error("no corpus: pass --corpus or set LIT_DOF_CORPUS")
    tokenizer = None
    if args.tokenizer:
        from lit_dof.teacher.loading import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    sizes = split_sizes(args.corpus, tokenizer, args.val_every, args.long_limit)
    for split, entry in sizes.items():
        tokens = f", {entry['tokens']} tokens" if "tokens" in entry else ""
        print(f"{split}: {entry['documents']} documents, {entry['characters']} characters{tokens}")
    if "lengths" in sizes["long"]:
        print(f"long: {sizes['long']['at_least_4096']} of {sizes['long']['documents']} documents ≥ 4096 tokens, "
              f"lengths {sizes['long']['lengths']}, {sizes['long']['scored_tokens']} tokens scored up to "
              f"{args.long_limit}")  # fmt: skip  # one line
    record = {"splits": sizes, "corpus": portable([str(args.corpus)]), "tokenizer": args.tokenizer,
              "versions": library_versions(), "command": portable([sys.executable, *sys.argv])}  # fmt: skip
    if args.output:
        atomic_write_json(args.output, record)
    return record


if __name__ == "__main__":
    main()
