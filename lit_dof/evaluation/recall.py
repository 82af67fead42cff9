"""Recall in natural text: the ``recall`` retrieval task — a made-up fact in held-out prose, asked at the end.

The passkey task hides its needle in repeated filler ("The grass is green. The sky is blue. …"), whose keys repeat
inside any window; a memory that keeps what is *novel* finds the needle there by construction (docs/results/far_term:
a cache ranked by key novelty found 12 of 20 passkeys and 0 of 20 recall items). This task puts the needle —
``" The locker code of Dubois is 57264."`` — into a block of the corpus's held-out documents at the grid's depths
and ends the block with its question and answer (:func:`lit_dof.hybrid.recall_items.placed_items`, the wording of the
hybrid search's recall metric, not the passkey's). Scoring is teacher-forced: an item is recalled when the model's
argmax is the answer's token at every answer position — one forward per item, no generation, and the same exact
match a greedy generation of the code would give.

:func:`recall_record` writes the retrieval stage's record format (``exact_match``, ``items``, ``examples`` with
``context``/``depth``/``prompt_tokens``/``needle_token``, ``cells``), so `lit-dof compare`'s report shows it beside
passkey; the record names the split its documents came from.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence

import torch

from lit_dof.evaluation.retrieval import retrieval_cells

TASK = "recall"
"""The task's name in ``lit-dof compare --retrieval_tasks``."""


def recall_record(
    model,
    tokenizer,
    corpus: str | os.PathLike,
    *,
    contexts: Sequence[int],
    depths: Sequence[float],
    trials: int,
    split: str = "test",
    seed: int = 0,
) -> dict:
    """Recall of ``model`` on ``trials`` items per (context, depth) cell.

    Args:
        model: a causal LM (``model(input_ids).logits`` ``(1, T, V)``).
        tokenizer: its tokenizer.
        corpus: a text corpus; the filler is its ``split`` documents.
        contexts: item lengths in tokens (filler, fact, question and answer); those beyond the model's
            ``max_position_embeddings`` are dropped.
        depths: where the fact starts, as a fraction of the filler in [0, 1].
        trials: items per cell.
        split: ``test`` to report, ``validation`` to choose (lit_dof.data.splits).
        seed: the facts' names and codes.

    Returns:
        ``{"n", "exact_match", "exact_match_stderr", "items": {"exact_match": [0/1 …]}, "examples": [{"context",
        "depth", "trial", "fact_depth", "prompt_tokens", "needle_token", "answers", "generation"}], "cells",
        "split", "seconds"}`` — ``needle_token`` is the fact's first token, ``prompt_tokens`` the answer's first,
        ``generation`` the argmax text at the answer's positions.

    Raises:
        ValueError: no context fits the model, an unknown split, or too few documents for the items.
    """
    from lit_dof.hybrid.recall_items import placed_items, recalled

    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    usable = [c for c in contexts if limit is None or c <= limit]
    if not usable:
        raise ValueError(f"no recall context fits the model's {limit} positions (asked for {list(contexts)})")
    start, examples, scores = time.time(), [], []
    device = next(model.parameters()).device
    for context in usable:
        items = placed_items(corpus, tokenizer, context, depths, trials, split=split, seed=seed)
        for index, item in enumerate(items):
            with torch.no_grad():
                logits = model(item["input_ids"].to(device)).logits
            first, stop = item["answer"]
            guess = logits[0, first - 1 : stop - 1].argmax(-1)
            scores.append(float(recalled(logits, item)))
            examples.append(
                {
                    "context": context,
                    "depth": float(depths[index // trials]),
                    "trial": index % trials,
                    "fact_depth": item["depth"],
                    "prompt_tokens": first,
                    "needle_token": item["fact"],
                    "answers": [tokenizer.decode(item["input_ids"][0, first:stop]).strip()],
                    "generation": tokenizer.decode(guess),
                }
            )
    n, mean = len(scores), sum(scores) / len(scores)
    return {
        "n": n,
        "exact_match": mean,
        "exact_match_stderr": math.sqrt(mean * (1 - mean) / (n - 1)) if n > 1 else 0.0,
        "items": {"exact_match": scores},
        "examples": examples,
        "cells": retrieval_cells(examples, scores),
        "split": split,
        "seconds": time.time() - start,
    }
