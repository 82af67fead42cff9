"""Held-out perplexity with a sliding window (the standard strided evaluation of causal LMs).

A stream of N tokens is scored in windows of ``window`` tokens whose starts advance by ``stride`` ≤ window.
Each token is scored exactly once, in the first window that holds it after that window's context part, so
every token after the first window sees at least max(1, window − stride) tokens of context (a window's first
scored token needs one token before it, so ``stride == window`` advances by window − 1: near-disjoint
blocks, the cheapest). The first window scores all its tokens but token 0; the last is pulled back to full
length. Smaller strides give more context at ≈ window / stride × the cost. NLLs accumulate in
:class:`torchmetrics.text.Perplexity` (context positions are ``ignore_index``).

The corpus measurements score one split of the corpus (:mod:`lit_dof.data.splits`): the **test** split by default
(untouched by model selection), ``split="validation"`` for model selection and to reproduce the records measured
before the test split existed (they scored validation); every record names its ``split`` and ``split_rule``.
Perplexity by position, the held-out record that pairs it with this one and long contexts:
:mod:`lit_dof.evaluation.position_perplexity`; whole long
documents by in-document position: :mod:`lit_dof.evaluation.long_documents`.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator

import torch
from torchmetrics.text import Perplexity

IGNORE = -100


def windows(num_tokens: int, window: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """``(start, end, first_scored)`` of every window over ``num_tokens`` tokens (see the module docstring).

    Raises:
        ValueError: ``window < 2`` or ``stride`` outside ``[1, window]``.
    """
    if window < 2 or not 1 <= stride <= window:
        raise ValueError(f"need window >= 2 and 1 <= stride <= window, got window={window}, stride={stride}")
    context = max(1, window - stride)  # a window's first scored token needs at least one token before it
    scored_until = 1  # token 0 has no context: never scored
    start = 0
    while scored_until < num_tokens:
        end = min(start + window, num_tokens)
        yield max(0, end - window), end, scored_until  # the last window is pulled back to full length
        scored_until = end
        start = end - context


def sliding_window_perplexity(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    window: int = 512,
    stride: int | None = None,
    batch_size: int = 4,
) -> tuple[float, int]:
    """Perplexity of ``model`` on a 1-D token stream.

    Args:
        model: a causal LM returning ``.logits`` ``(B, T, V)``.
        tokens: ``(N,)`` token ids.
        window: tokens per forward.
        stride: window advance (default: ``window``, disjoint blocks).
        batch_size: windows per forward (windows of one batch share a length; the last may be shorter).

    Returns:
        (perplexity, number of scored tokens = N − 1).

    Raises:
        ValueError: bad window/stride, or fewer than 2 tokens.
    """
    stride = stride or window
    tokens = tokens.reshape(-1).long()
    if tokens.numel() < 2:
        raise ValueError("need at least 2 tokens to measure perplexity")
    device = next(model.parameters()).device
    metric = Perplexity(ignore_index=IGNORE).to(device)
    spans = list(windows(tokens.numel(), window, stride))
    model.eval()
    with torch.no_grad():
        for i in range(0, len(spans), batch_size):
            group = spans[i : i + batch_size]
            by_length: dict[int, list] = {}
            for span in group:
                by_length.setdefault(span[1] - span[0], []).append(span)
            for length, same in by_length.items():
                ids = torch.stack([tokens[s:e] for s, e, _ in same]).to(device)
                target = ids.clone()
                for row, (s, _, first) in enumerate(same):
                    target[row, : first - s] = IGNORE  # context only: scored by an earlier window
                logits = model(ids, use_cache=False).logits[:, :-1].float()
                metric.update(logits, target[:, 1:])
    return float(metric.compute()), tokens.numel() - 1


def text_tokens(texts: Iterable[str], tokenizer, max_tokens: int | None = None) -> torch.Tensor:
    """Concatenate the token ids of ``texts`` (EOS between documents), stopping at ``max_tokens``: ``(N,)``."""
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if max_tokens is not None and len(ids) >= max_tokens:
            return torch.tensor(ids[:max_tokens])
    return torch.tensor(ids)


def heldout_documents(path: str | os.PathLike, val_every: int = 100) -> Iterator[str]:
    """The validation documents of a corpus file: every ``val_every``-th, as
    :class:`~lit_dof.data.datamodule.WikipediaDataModule`'s validation split (never trained on; model selection).
    Any split: :func:`lit_dof.data.sources.split_documents`."""
    from lit_dof.data.corpus import is_heldout, iter_documents

    return (doc for i, doc in enumerate(iter_documents(path)) if is_heldout(i, val_every))


def corpus_perplexity(
    model,
    tokenizer,
    path: str | os.PathLike,
    *,
    heldout: bool = True,
    val_every: int = 100,
    max_tokens: int = 16384,
    window: int = 512,
    stride: int | None = None,
    batch_size: int = 4,
    split: str = "test",
) -> dict:
    """Sliding-window perplexity on a text file (``.txt``/``.gz``/``.jsonl``/WikiExtractor).

    ``heldout``: score only the documents of ``split`` (``"test"``, ``"validation"`` — every ``val_every``-th
    document, as the training data module holds them out — or ``"long"``, :mod:`lit_dof.data.splits`); otherwise the
    file from its start. ``max_tokens`` bounds the stream.

    Returns:
        ``{"ppl", "tokens", "window", "stride", "source", "heldout", "split", "split_rule"}`` (``split`` ``None``
        for the whole file).

    Raises:
        ValueError: an unknown split.
    """
    from lit_dof.data.corpus import iter_documents
    from lit_dof.data.sources import split_documents

    docs = split_documents(path, split, val_every) if heldout else iter_documents(path)
    tokens = text_tokens(docs, tokenizer, max_tokens)
    return stream_perplexity(
        model,
        tokens,
        path,
        split if heldout else None,
        window=window,
        stride=stride,
        batch_size=batch_size,
        val_every=val_every,
    )


def stream_perplexity(
    model,
    tokens: torch.Tensor,
    path,
    split: str | None,
    *,
    window: int,
    stride: int | None,
    batch_size: int,
    val_every: int = 100,
) -> dict:
    """:func:`corpus_perplexity`'s record for a stream already read from ``path`` (``tokens`` ``(N,)``; ``split``
    ``None``: the whole file): the sliding-window perplexity, the tokens scored and the setting."""
    from lit_dof.data.splits import split_rule

    ppl, count = sliding_window_perplexity(model, tokens, window=window, stride=stride, batch_size=batch_size)
    return {
        "ppl": ppl,
        "tokens": count,
        "window": window,
        "stride": stride or window,
        "source": str(path),
        "heldout": split is not None,
        "split": split,
        "split_rule": split_rule(split, val_every) if split else None,
    }
