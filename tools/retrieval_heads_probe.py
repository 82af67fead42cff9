"""Retrieval heads, untrained: do a few exact KV heads retrieve as well as whole exact layers at the same KV bytes?

DuoAttention (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming
Heads", §3) keeps the full KV cache of the few heads that fetch far facts and a window + sinks in every other head;
"Retrieval Head Mechanistically Explains Long-Context Factuality" (Wu et al. 2024, §2) finds those heads by the
attention they put on the needle while the answer is copied. Issue #45's retrieval layers keep six whole layers
exact (18 KV heads of SmolLM2's 90); this probe asks whether 18 KV heads spread over the layers do better.

1. **Score** (the teacher, eager attention): on recall items of the corpus's *validation* documents
   (:func:`lit_dof.hybrid.recall_items.recall_blocks`, ``--score_items`` blocks of ``--score_block`` tokens after
   the ``--skip`` blocks a search used), the attention mass each query head puts on the fact's sentence (its owner
   and code) from the positions that predict the answer; a KV head's score is the **max** over its query heads of
   that mass, averaged over items (one query head that copies needs its KV head's whole cache).
2. **Arms**, all the untrained teacher with per-head masks through transformers' attention interface: ``full``;
   ``layers`` — every KV head of ``--layers`` exact, window + sinks in the other heads; ``heads<k>`` — the k
   best-scored KV heads exact, window + sinks elsewhere (k = ``--heads``; k = len(layers) × Hk spends the same KV
   bytes as ``layers``); ``window`` — window + sinks everywhere.
3. **Measures**, teacher-forced exact match (:func:`~lit_dof.hybrid.recall_items.recalled`, one forward per item):
   recall items at ``--contexts`` with the fact at ``--depths`` (validation documents, the facts drawn with seed 1:
   not the items the heads were scored on) and passkey prompts (:func:`lit_dof.evaluation.needles.passkey` with
   task seed 1; the evaluation reports seed 0).

Validation only: it may be used to choose. Usage: python tools/retrieval_heads_probe.py [--teacher NAME]
    [--corpus PATH] [--layers 7 8 14 18 20 23] [--heads 18] [--window 64] [--sinks 4] [--contexts 2048 4096]
    [--depths 0.25 0.5 0.75] [--trials 2] [--arms full window layers heads] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lit_dof.evaluation.needles import passkey
from lit_dof.hybrid.recall_items import placed_items, recall_blocks, recalled
from lit_dof.pipeline.exact_heads import head_scores, top_heads
from lit_dof.teacher.families import attention_layers
from lit_dof.teacher.loading import DEFAULT_TEACHER, load_teacher

ATTENTION = "lit_dof_head_windows"
"""The name under which :func:`head_window_attention` is registered with transformers' attention interface."""


@dataclass(frozen=True)
class HeadWindows:
    """Exact attention in the KV heads ``exact[layer]``, window + sinks in every other head (keys and values).

    Attributes:
        window: w, the last tokens attended (the query's own included).
        sinks: s, the first tokens always attended.
        exact: ``{layer: KV heads}`` kept with full causal attention.
    """

    window: int
    sinks: int
    exact: dict[int, frozenset[int]] = field(default_factory=dict)

    def mask(self, layer: int, num_heads: int, num_kv_heads: int, length: int, device) -> torch.Tensor:
        """``(1, Hq, T, T)`` bool, True where query i may attend key j (query head h reads KV head h // (Hq/Hk))."""
        i = torch.arange(length, device=device)[:, None]
        j = torch.arange(length, device=device)[None, :]
        causal = j <= i
        local = causal & ((i - j < self.window) | (j < self.sinks))
        group = num_heads // num_kv_heads
        rows = [causal if h // group in self.exact.get(layer, ()) else local for h in range(num_heads)]
        return torch.stack(rows)[None]


def head_window_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers attention function: SDPA under ``module.lit_dof_head_windows``'s per-head mask (one unpadded
    sequence, no cache: ``query`` ``(1, Hq, T, d)``, ``key`` ``(1, Hk, T, d)``), else plain SDPA."""
    spec = getattr(module, "lit_dof_head_windows", None)
    if spec is not None:
        if query.shape[0] != 1 or key.shape[-2] != query.shape[-2]:
            raise ValueError("per-head windows score one sequence in one forward: no batch, no decoding from a cache")
        attention_mask = spec.mask(module.layer_idx, query.shape[1], key.shape[1], query.shape[-2], query.device)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def set_head_windows(model, spec: HeadWindows | None) -> None:
    """Put ``model`` (a supported causal LM) behind ``spec`` (``None``: its full attention again)."""
    AttentionInterface.register(ATTENTION, head_window_attention)
    model.set_attn_implementation(ATTENTION if spec is not None else "sdpa")
    for layer in attention_layers(model):
        layer.module.lit_dof_head_windows = spec


def passkey_items(tokenizer, context: int, depths, trials: int, seed: int = 1) -> list[dict]:
    """Passkey prompts with their answer appended, as recall items ``{"input_ids", "answer"}`` (teacher-forced; prompt
    and answer tokenized apart, as lm-eval's context and continuation)."""
    items = []
    for depth in depths:
        for trial in range(trials):
            example = passkey(tokenizer, context, depth, trial, seed)
            prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
            answer = tokenizer(f" {example.answer}", add_special_tokens=False)["input_ids"]  # as lm-eval's continuation
            items.append(
                {"input_ids": torch.tensor(prompt + answer)[None], "answer": (len(prompt), len(prompt) + len(answer))}
            )
    return items


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument("--corpus", default=os.environ.get("LIT_DOF_CORPUS"), help="corpus (its validation docs)")
    parser.add_argument("--layers", type=int, nargs="*", default=[7, 8, 14, 18, 20, 23], help="exact layers arm")
    parser.add_argument("--heads", type=int, nargs="*", default=[18], help="k of each heads<k> arm")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--score_block", type=int, default=1024, help="tokens per scoring item")
    parser.add_argument("--score_items", type=int, default=16)
    parser.add_argument("--skip", type=int, default=32, help="validation blocks passed over (a search's items)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--depths", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--arms", nargs="+", default=["full", "window", "layers", "heads"], help="which arms to run")
    parser.add_argument("--json", help="write the scores, arms and per-item results here")
    args = parser.parse_args(argv)
    teacher, tokenizer = load_teacher(args.teacher)
    start = time.time()
    score_items = recall_blocks(args.corpus, tokenizer, args.score_block, args.score_items, 0, skip=args.skip)[0]
    scores = head_scores(teacher, score_items)
    print(f"scored {scores.numel()} KV heads on {len(score_items)} items in {time.time() - start:.0f} s")
    kv_heads = scores.shape[1]
    arms = {"full": None, "window": HeadWindows(args.window, args.sinks)}
    arms = {name: spec for name, spec in arms.items() if name in args.arms}
    if args.layers and "layers" in args.arms:
        exact = {layer: frozenset(range(kv_heads)) for layer in args.layers}
        arms["layers"] = HeadWindows(args.window, args.sinks, exact)
    for k in args.heads if "heads" in args.arms else ():
        chosen = {layer: frozenset(heads) for layer, heads in top_heads(scores, k).items()}
        arms[f"heads{k}"] = HeadWindows(args.window, args.sinks, chosen)
    results: dict[str, dict] = {name: {} for name in arms}
    for context in args.contexts:
        tasks = {
            "recall": placed_items(args.corpus, tokenizer, context, args.depths, args.trials, seed=1),
            "passkey": passkey_items(tokenizer, context, args.depths, args.trials),
        }
        for name, spec in arms.items():
            set_head_windows(teacher, spec)
            for task, items in tasks.items():
                with torch.no_grad():
                    hits = [recalled(teacher(item["input_ids"], use_cache=False).logits, item) for item in items]
                results[name][f"{task}@{context}"] = hits
                print(f"{name:>8} {task:>7} @ {context}: {sum(hits)}/{len(hits)} ({time.time() - start:.0f} s)")
    set_head_windows(teacher, None)
    if args.json:
        record = {
            "scores": scores.tolist(),
            "arms": {
                n: None if s is None else {str(k): sorted(v) for k, v in s.exact.items()} for n, s in arms.items()
            },
            "results": results,
            "window": args.window,
            "sinks": args.sinks,
            "seconds": time.time() - start,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
