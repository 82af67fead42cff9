"""Which far tokens does an exact far cache keep at the end of a passkey prompt (issue #45, item 3)?

Runs a student whose sliding-window layers keep an exact far cache (``sliding_window.far_cache: K``) over one passkey
prompt of the retrieval stage (lit_dof.evaluation.retrieval_data, the same seeded prompt as `lit-dof compare`'s
retrieval cells), then reads each layer's cache from the decoding state: the K positions per KV head kept after the
prompt. Prints the needle's answer tokens (the passkey's digit tokens, where the prompt states it), and per layer how
many of them each head keeps — the question being whether the cache's score keeps the tokens a copy needs.
With ``--recall N`` the prompt is instead the N-th recall item of the hybrid search (lit_dof.hybrid.recall_items: a
made-up locker code in held-out Wikipedia prose, ``--corpus``), up to its question: natural text, no repeated filler.

Usage: python tools/far_cache_positions.py STUDENT [--context 2048] [--depth 0.5] [--trial 0] [--layers 0 10 20 29]
       python tools/far_cache_positions.py STUDENT --recall 0 [--context 2048] [--corpus PATH]
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoTokenizer

from lit_dof.evaluation.retrieval_data import examples
from lit_dof.hybrid.recall_items import recall_blocks
from lit_dof.students import load_student


def answer_positions(ids: list[int], tokenizer, answer: str) -> list[int]:
    """Positions of the prompt's tokens that spell part of ``answer`` (digits only: the passkey's value)."""
    spelled = [tokenizer.decode([t]).strip() for t in ids]
    return [i for i, text in enumerate(spelled) if text and text.isdigit() and text in answer]


def passkey_prompt(tokenizer, context: int, depth: float, trial: int) -> tuple[torch.Tensor, list[int], str]:
    """The retrieval stage's passkey prompt: ``(ids (1, T), answer positions, answer)``."""
    example = examples("passkey", tokenizer, contexts=[context], depths=[depth], trials=trial + 1)[-1]
    ids = tokenizer(example.prompt, return_tensors="pt").input_ids
    return ids, answer_positions(ids[0].tolist(), tokenizer, example.answer), example.answer


def recall_prompt(tokenizer, corpus: str, block: int, index: int) -> tuple[torch.Tensor, list[int], str]:
    """The ``index``-th held-out recall item up to its question: ``(ids (1, T), the fact's code positions, code)``.

    The code's positions are the tokens of the fact (from its first token, which the item records) whose text
    overlaps the code's digits, whichever way the tokenizer splits or merges them."""
    item = recall_blocks(corpus, tokenizer, block, 0, index + 1)[2][index]
    start, stop = item["answer"]
    ids, code = item["input_ids"][:, :start], tokenizer.decode(item["input_ids"][0, start:stop]).strip()
    pieces = [tokenizer.decode([t]) for t in ids[0, item["fact"] : item["fact"] + 48].tolist()]  # the fact and more
    text, ends = "", []
    for piece in pieces:
        text += piece
        ends.append(len(text))
    begin = text.index(code)
    finish = begin + len(code)
    positions = [item["fact"] + j for j, end in enumerate(ends) if end > begin and end - len(pieces[j]) < finish]
    return ids, positions, code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student", help="a student folder whose window layers keep a far cache")
    parser.add_argument("--context", type=int, default=2048, help="prompt length in tokens (a retrieval context)")
    parser.add_argument("--depth", type=float, default=0.5, help="needle depth in [0, 1]")
    parser.add_argument("--trial", type=int, default=0, help="which trial of that cell (the retrieval seed 0)")
    parser.add_argument("--layers", type=int, nargs="*", help="layers to list (default: every layer's counts only)")
    parser.add_argument("--recall", type=int, help="use this held-out recall item instead (block = --context)")
    parser.add_argument("--corpus", default=os.environ.get("LIT_DOF_CORPUS"), help="the recall items' corpus")
    args = parser.parse_args(argv)
    student = load_student(args.student).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    if args.recall is None:
        ids, wanted, answer = passkey_prompt(tokenizer, args.context, args.depth, args.trial)
    else:
        ids, wanted, answer = recall_prompt(tokenizer, args.corpus, args.context, args.recall)
    print(f"prompt {ids.shape[1]} tokens, answer {answer!r} at token positions {wanted}")
    with torch.no_grad():
        cache = student(ids, use_cache=True).past_key_values
    tally = []
    for index, layer in enumerate(cache.layers):
        far = getattr(getattr(layer, "state", None), "cache", None)
        if far is None:
            continue
        kept = [sorted(p for p in head.tolist() if p >= 0) for head in far.positions[0]]
        counts = [len(set(k) & set(wanted)) for k in kept]
        tally += counts
        print(f"layer {index:2d}: answer tokens kept per KV head {counts} of {len(wanted)}")
        if args.layers and index in args.layers:
            for head, positions in enumerate(kept):
                print(f"    head {head}: {positions}")
    if tally:
        full, none = sum(c == len(wanted) for c in tally), sum(c == 0 for c in tally)
        print(f"{len(tally)} caches: {full} hold all {len(wanted)} answer tokens, {none} none")


if __name__ == "__main__":
    main()
