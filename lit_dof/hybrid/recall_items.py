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
from collections.abc import Iterable, Sequence
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


def _item(filler: torch.Tensor, tokenizer, rng: random.Random, depth: float | None = None) -> dict:
    name, code = rng.choice(NAMES), str(rng.randint(10000, 99999))
    encode = lambda text: torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    fact = encode(f" The locker code of {name} is {code}.")
    question, answer = encode(f" The locker code of {name} is"), encode(f" {code}")
    keep = filler.numel() - fact.numel() - question.numel() - answer.numel()
    if keep < 2:
        raise ValueError(f"blocks of {filler.numel()} tokens leave no filler around the fact: use a larger block")
    at = int(keep * (rng.uniform(*DEPTHS) if depth is None else depth))
    ids = torch.cat([filler[:at], fact, filler[at:keep], question, answer])
    return {
        "input_ids": ids[None],
        "answer": (ids.numel() - answer.numel(), ids.numel()),
        "depth": at / keep,
        "fact": at,
        "fact_end": at + fact.numel(),
    }


def document_recall_items(
    documents: Iterable[str],
    tokenizer,
    block: int,
    count: int,
    seed: int = 0,
    skip: int = 0,
    name: str = "the documents",
) -> list[dict]:
    """``count`` recall items of ``block`` tokens, one per consecutive block of ``documents`` (EOS between them),
    each fact at a seeded depth of 10–90% of its filler; the first ``skip`` blocks passed over.

    Args:
        documents: the filler's texts, in order (held-out documents: never trained on).
        tokenizer: the model's tokenizer.
        block: tokens per item (filler, fact, question and answer).
        count: items.
        seed: the facts' names, codes and depths (with ``skip``: the same seed and skip give the same items).
        skip: blocks passed over first.
        name: what ``documents`` are, for the error message.

    Returns:
        items ``{"input_ids": (1, block), "answer": (start, stop), "depth", "fact", "fact_end"}`` (the answer's
        token positions; the fact's first token and the one after its last).

    Raises:
        ValueError: too few tokens for ``skip + count`` blocks, or a block too short for its fact.
    """
    total = skip + count
    tokens = text_tokens(documents, tokenizer, max_tokens=block * total)
    if tokens.numel() < block * total:
        raise ValueError(f"{name} gives only {tokens.numel() // block} blocks of {block} tokens; ask for fewer items")
    rng = random.Random(f"recall/{seed}/{skip}")
    return [_item(tokens[i * block : (i + 1) * block], tokenizer, rng) for i in range(skip, total)]


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
        ``(search, confirm, heldout, where)``: items ``{"input_ids": (1, block), "answer": (start, stop), "depth",
        "fact", "fact_end"}`` (the answer's token positions; the fact's first token and the one after its last)
        and a sentence saying where they come from.

    Raises:
        ValueError: too few held-out tokens for that many items, or a block too short for its fact.
    """
    count = search_items + heldout_items + confirm_items
    items = document_recall_items(heldout_documents(corpus), tokenizer, block, count, seed, skip, name=str(corpus))
    where = (
        f"recall items: one made-up fact at a depth of 10–90% in {block}-token blocks of held-out documents of "
        f"{Path(corpus).name}, its question and answer at the end (teacher-forced exact match)"
    )
    h = search_items + heldout_items
    return items[:search_items], items[h:], items[search_items:h], where


def placed_items(
    corpus: str | os.PathLike,
    tokenizer,
    block: int,
    depths: Sequence[float],
    trials: int,
    split: str = "validation",
    seed: int = 0,
) -> list[dict]:
    """Recall items of ``block`` tokens with the fact at fixed depths (a retrieval grid's row): ``trials`` items per
    depth, each its own block of the ``split`` documents of ``corpus``, in order depth by depth.

    Args:
        corpus: a text corpus (WikiExtractor or plain text).
        tokenizer: the model's tokenizer.
        block: tokens per item.
        depths: where the fact starts, as a fraction of the filler in [0, 1].
        trials: items per depth.
        split: the documents the filler comes from (lit_dof.data.splits; ``test`` to report, ``validation`` to
            choose).
        seed: the facts' names and codes.

    Returns:
        items ``{"input_ids": (1, block), "answer": (start, stop), "depth", "fact" (its first token)}``.

    Raises:
        ValueError: an unknown split, too few tokens in it, or a block too short for its fact.
    """
    from lit_dof.data.sources import split_documents

    total = len(depths) * trials
    tokens = text_tokens(split_documents(corpus, split), tokenizer, max_tokens=block * total)
    if tokens.numel() < block * total:
        raise ValueError(
            f"the {split} documents of {corpus} give only {tokens.numel() // block} blocks of {block} "
            f"tokens; ask for fewer trials or contexts"
        )
    rng = random.Random(f"recall/{seed}/{split}/{block}")
    cells = [d for d in depths for _ in range(trials)]
    return [_item(tokens[i * block : (i + 1) * block], tokenizer, rng, d) for i, d in enumerate(cells)]


def recalled(logits: torch.Tensor, item: dict) -> bool:
    """Whether the argmax of ``logits`` ``(1, T, V)`` is the answer's token at every answer position of ``item``."""
    start, stop = item["answer"]
    ids = item["input_ids"]
    return bool((logits[0, start - 1 : stop - 1].argmax(-1) == ids[0, start:stop].to(logits.device)).all())
