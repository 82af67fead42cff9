"""Recall items: does a hybrid still retrieve a fact from far back? The items of ``lit-dof hybrid --metric recall``
(a retrieval validation set for choosing which layers keep softmax attention; issue #45, item 4).

Each item is a block of held-out text (the corpus's validation documents, never trained on) with one made-up fact
placed at a seeded depth — ``" The locker code of Alvarez is 48213."`` — and, at the end, the fact's question
``" The locker code of Alvarez is"`` followed by its answer. The score is teacher-forced: an item is recalled when
the model's argmax at every answer position is the answer's token, so one forward per item measures retrieval (no
generation). The wording is this module's own, not the evaluation's passkey prompt (lit_dof.evaluation.needles):
choosing layers on it does not tune to the reported task.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from lit_dof.evaluation.perplexity import heldout_documents, text_tokens

NAMES = tuple(
    "Alvarez Brennan Castellano Dubois Eriksen Falkner Gallagher Haverford Ibarra Jankowski Kowalczyk Lindqvist "
    "Marchetti Nakamura Okafor Petrov Quintero Rasmussen Sandoval Takahashi Underwood Vasquez Whitaker Yamamoto "
    "Zielinski".split()
)
"""The made-up owners of the facts (one per item, drawn with the code)."""

DEPTHS = (0.1, 0.9)
"""The fact lies uniformly between these fractions of the filler."""


def _item(filler: torch.Tensor, tokenizer, rng: random.Random) -> dict:
    name, code = rng.choice(NAMES), str(rng.randint(10000, 99999))
    encode = lambda text: torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    fact = encode(f" The locker code of {name} is {code}.")
    question, answer = encode(f" The locker code of {name} is"), encode(f" {code}")
    keep = filler.numel() - fact.numel() - question.numel() - answer.numel()
    if keep < 2:
        raise ValueError(f"blocks of {filler.numel()} tokens leave no filler around the fact: use a larger block")
    at = int(keep * rng.uniform(*DEPTHS))
    ids = torch.cat([filler[:at], fact, filler[at:keep], question, answer])
    return {"input_ids": ids[None], "answer": (ids.numel() - answer.numel(), ids.numel()), "depth": at / keep}


def recall_blocks(
    corpus: str | os.PathLike,
    tokenizer,
    block: int,
    search_items: int,
    heldout_items: int,
    confirm_items: int = 0,
    seed: int = 0,
    skip: int = 0,
) -> tuple[list[dict], list[dict], list[dict], str]:
    """Recall items of ``block`` tokens each, one per block of ``corpus``'s held-out documents: the first
    ``search_items`` for the search, the next ``heldout_items`` held out, then ``confirm_items``.

    Args:
        corpus: a text corpus (WikiExtractor or plain text); its held-out documents are the filler.
        tokenizer: the bank's tokenizer.
        block: tokens per item (filler, fact, question and answer).
        search_items: items for the search.
        heldout_items: items held out (the orderings' curves).
        confirm_items: items for the confirmation.
        seed: the facts' names, codes and depths.
        skip: blocks of filler passed over first (the verification items come after every other one).

    Returns:
        ``(search, confirm, heldout, where)``: items ``{"input_ids": (1, block), "answer": (start, stop), "depth"}``
        (the answer's token positions) and a sentence saying where they come from.

    Raises:
        ValueError: too few held-out tokens for that many items, or a block too short for its fact.
    """
    total = skip + search_items + heldout_items + confirm_items
    tokens = text_tokens(heldout_documents(corpus), tokenizer, max_tokens=block * total)
    if tokens.numel() < block * total:
        raise ValueError(f"{corpus} gives only {tokens.numel() // block} blocks of {block} tokens; ask for fewer items")
    rng = random.Random(f"recall/{seed}/{skip}")
    items = [_item(tokens[i * block : (i + 1) * block], tokenizer, rng) for i in range(skip, total)]
    where = (
        f"recall items: one made-up fact at a depth of 10–90% in {block}-token blocks of held-out documents of "
        f"{Path(corpus).name}, its question and answer at the end (teacher-forced exact match)"
    )
    h = search_items + heldout_items
    return items[:search_items], items[h:], items[search_items:h], where


def recalled(logits: torch.Tensor, item: dict) -> bool:
    """Whether the argmax of ``logits`` ``(1, T, V)`` is the answer's token at every answer position of ``item``."""
    start, stop = item["answer"]
    ids = item["input_ids"]
    return bool((logits[0, start - 1 : stop - 1].argmax(-1) == ids[0, start:stop].to(logits.device)).all())
