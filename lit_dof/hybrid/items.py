"""What a hybrid search scores: disjoint search, confirmation and held-out items of a multiple-choice task
(:func:`task_items`), or token blocks of a corpus's held-out documents for perplexity (:func:`text_blocks`).

Tasks with a validation split (ARC Dev, LogiQA Eval, MMLU val) search on it and hold out items of their test
split; other tasks split a seeded permutation of their evaluation set into two halves.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from lit_dof.evaluation import task_data
from lit_dof.evaluation.perplexity import heldout_documents, text_tokens

_VALIDATION_SPLITS = {
    "arc_easy": lambda d: (task_data.arc(d, "Easy", "Dev"), task_data.arc(d, "Easy", "Test")),
    "arc_challenge": lambda d: (task_data.arc(d, "Challenge", "Dev"), task_data.arc(d, "Challenge", "Test")),
    "logiqa": lambda d: (task_data.logiqa(d, "Eval"), task_data.logiqa(d, "Test")),
    "mmlu": lambda d: (task_data.mmlu(d, "val"), task_data.mmlu(d, "test")),
}


def task_items(
    task: str, data_dir: str | os.PathLike, search_items: int, heldout_items: int, seed: int = 0, confirm_items: int = 0
) -> tuple[list[dict], list[dict], list[dict], str]:
    """Disjoint search, confirmation and held-out items of ``task``, and a sentence saying where they come from.

    Tasks with a validation split search on it and hold out items of the test split; the others split a
    seeded permutation of their evaluation set. Search and held-out items are seeded samples of the requested
    sizes (all when smaller); confirmation items are a seeded sample of the validation items the search
    does not use.

    Returns:
        ``(search, confirm, heldout, where)``.

    Raises:
        ValueError: an unknown task, or sizes < 1 (confirmation: < 0). FileNotFoundError: missing data files.
    """
    if task not in task_data.TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(task_data.TASKS)}")
    if search_items < 1 or heldout_items < 1 or confirm_items < 0:
        raise ValueError(
            f"search_items and heldout_items must be >= 1 and confirm_items >= 0, got "
            f"{search_items}, {heldout_items}, {confirm_items}"
        )
    rng = random.Random(seed)
    if task in _VALIDATION_SPLITS:
        validation, test = _VALIDATION_SPLITS[task](data_dir)
        where = f"search: {task} validation split ({len(validation)}); held out: its test split ({len(test)})"
    else:
        docs = task_data.load_task(task, data_dir)
        order = list(range(len(docs)))
        rng.shuffle(order)
        half = len(docs) // 2
        validation, test = [docs[i] for i in order[:half]], [docs[i] for i in order[half:]]
        where = f"search and held-out items: the two halves of a seeded permutation of {task} ({len(docs)})"

    def sample(pool: list[int], n: int) -> list[int]:
        return pool if n >= len(pool) else sorted(rng.sample(pool, n))

    search = sample(list(range(len(validation))), search_items)
    heldout = sample(list(range(len(test))), heldout_items)
    confirm = sample(sorted(set(range(len(validation))) - set(search)), confirm_items) if confirm_items else []
    if confirm_items and len(confirm) < confirm_items:
        where += f"; only {len(confirm)} validation items are left for confirmation"
    return [validation[i] for i in search], [validation[i] for i in confirm], [test[i] for i in heldout], where


def text_blocks(
    corpus: str | os.PathLike, tokenizer, block: int, search_items: int, heldout_items: int, confirm_items: int = 0
) -> tuple[list[dict], list[dict], list[dict], str]:
    """Non-overlapping ``(1, block)`` token blocks of ``corpus``'s held-out documents: the first
    ``search_items`` for the search, the next ``heldout_items`` held out, then ``confirm_items`` for
    confirmation. Returns ``(search, confirm, heldout, where)``."""
    total = search_items + heldout_items + confirm_items
    tokens = text_tokens(heldout_documents(corpus), tokenizer, max_tokens=block * total)
    blocks = [{"input_ids": tokens[None, i : i + block]} for i in range(0, tokens.numel() - block + 1, block)]
    if len(blocks) < total:
        raise ValueError(f"{corpus} gives only {len(blocks)} blocks of {block} tokens; ask for fewer items")
    where = f"blocks of {block} tokens from held-out documents of {Path(corpus).name}"
    h = search_items + heldout_items
    return blocks[:search_items], blocks[h:total], blocks[search_items:h], where


@dataclass
class Items:
    """The scored data of one search, batched for :class:`~lit_dof.hybrid.scoring.HybridScorer`.

    Attributes:
        search, confirm, heldout: batches of the search, confirmation (may be empty) and held-out items.
        confirm_count: confirmation items (or blocks) actually drawn.
        where: where the items come from (a sentence for the report).
    """

    search: list[dict]
    confirm: list[dict]
    heldout: list[dict]
    confirm_count: int
    where: str
