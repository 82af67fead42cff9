"""Which far tokens does an exact far cache keep at the end of a passkey prompt (issue #45, item 3)?

Runs a student whose sliding-window layers keep an exact far cache (``sliding_window.far_cache: K``) over one passkey
prompt of the retrieval stage (lit_dof.evaluation.retrieval_data, the same seeded prompt as `lit-dof compare`'s
retrieval cells), then reads each layer's cache from the decoding state: the K positions per KV head kept after the
prompt. Prints the needle's answer tokens (the passkey's digit tokens, where the prompt states it), and per layer how
many of them each head keeps — the question being whether the window-mass score keeps the tokens a copy needs.

Usage: python tools/far_cache_positions.py STUDENT [--context 2048] [--depth 0.5] [--trial 0] [--layers 0 10 20 29]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoTokenizer

from lit_dof.evaluation.retrieval_data import examples
from lit_dof.students import load_student


def answer_positions(ids: list[int], tokenizer, answer: str) -> list[int]:
    """Positions of the prompt's tokens that spell part of ``answer`` (digits only: the passkey's value)."""
    spelled = [tokenizer.decode([t]).strip() for t in ids]
    return [i for i, text in enumerate(spelled) if text and text.isdigit() and text in answer]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student", help="a student folder whose window layers keep a far cache")
    parser.add_argument("--context", type=int, default=2048, help="prompt length in tokens (a retrieval context)")
    parser.add_argument("--depth", type=float, default=0.5, help="needle depth in [0, 1]")
    parser.add_argument("--trial", type=int, default=0, help="which trial of that cell (the retrieval seed 0)")
    parser.add_argument("--layers", type=int, nargs="*", help="layers to list (default: every layer's counts only)")
    args = parser.parse_args(argv)
    student = load_student(args.student).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    grid = examples("passkey", tokenizer, contexts=[args.context], depths=[args.depth], trials=args.trial + 1)
    example = grid[-1]
    ids = tokenizer(example.prompt, return_tensors="pt").input_ids
    wanted = answer_positions(ids[0].tolist(), tokenizer, example.answer)
    print(f"prompt {ids.shape[1]} tokens, answer {example.answer!r} at token positions {wanted}")
    with torch.no_grad():
        cache = student(ids, use_cache=True).past_key_values
    for index, layer in enumerate(cache.layers):
        far = getattr(getattr(layer, "state", None), "cache", None)
        if far is None:
            continue
        kept = [sorted(p for p in head.tolist() if p >= 0) for head in far.positions[0]]
        counts = [len(set(k) & set(wanted)) for k in kept]
        print(f"layer {index:2d}: answer tokens kept per KV head {counts} of {len(wanted)}")
        if args.layers and index in args.layers:
            for head, positions in enumerate(kept):
                print(f"    head {head}: {positions}")


if __name__ == "__main__":
    main()
