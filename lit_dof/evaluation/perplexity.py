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
Whole long documents by in-document position: :mod:`lit_dof.evaluation.long_documents`.
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Iterator, Sequence

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
    model: torch.nn.Module, tokens: torch.Tensor, *, window: int = 512, stride: int | None = None,
    batch_size: int = 4,
) -> tuple[float, int]:  # fmt: skip  # packed signature
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


def corpus_perplexity(model, tokenizer, path: str | os.PathLike, *, heldout: bool = True, val_every: int = 100,
                      max_tokens: int = 16384, window: int = 512, stride: int | None = None,
                      batch_size: int = 4, split: str = "test") -> dict:  # fmt: skip  # packed signature
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
    return _stream_perplexity(model, tokens, path, split if heldout else None, window=window, stride=stride,
                              batch_size=batch_size, val_every=val_every)  # fmt: skip  # packed args


def _stream_perplexity(model, tokens: torch.Tensor, path, split: str | None, *, window: int, stride: int | None,
                       batch_size: int, val_every: int = 100) -> dict:  # fmt: skip  # packed signature
    """:func:`corpus_perplexity`'s record for a stream already read from ``path`` (``tokens`` ``(N,)``; ``split``
    ``None``: the whole file)."""
    from lit_dof.data.splits import split_rule

    ppl, count = sliding_window_perplexity(model, tokens, window=window, stride=stride, batch_size=batch_size)
    return {"ppl": ppl, "tokens": count, "window": window, "stride": stride or window, "source": str(path),
            "heldout": split is not None, "split": split,
            "split_rule": split_rule(split, val_every) if split else None}  # fmt: skip  # compact dict


def heldout_perplexity(model, tokenizer, path: str | os.PathLike, *, max_tokens: int = 16384, window: int = 512,
                       stride: int | None = 256, split: str = "test") -> dict:  # fmt: skip  # packed signature
    """The comparison's held-out measurement: :func:`corpus_perplexity` on one split of the corpus plus
    :func:`position_perplexity` of the same token stream in blocks of ``window`` tokens (buckets 0–63 / 64–255 /
    256–``window``−1), so that two models measured on the same corpus and split pair block by block
    (:func:`paired_perplexity_ratio`).

    Args:
        model: a causal LM returning ``.logits`` ``(B, T, V)``.
        tokenizer: its tokenizer.
        path: the corpus (``.txt``/``.gz``/``.jsonl``/WikiExtractor); the documents of ``split`` are scored.
        max_tokens: tokens of the split's stream (the first this many).
        window: sliding window and block length (tokens).
        stride: window stride (tokens; ``None``: ``window``).
        split: ``"test"`` (default), or ``"validation"``: model selection, and the split of every record measured
            before the test split existed (docs/results) — pass it to reproduce one.

    Returns:
        :func:`corpus_perplexity`'s record plus ``"by_position"``, a :func:`position_perplexity` record.

    Raises:
        FileNotFoundError: no file at ``path``. ValueError: an unknown split.
    """
    from lit_dof.data.sources import split_documents

    tokens = text_tokens(split_documents(path, split), tokenizer, max_tokens)  # read and tokenised once for both
    result = _stream_perplexity(model, tokens, path, split, window=window, stride=stride, batch_size=4)
    block = min(window, tokens.numel())  # a stream shorter than the window is one block
    edges = [e for e in (0, 64, 256) if e < block] + [block]
    result["by_position"] = position_perplexity(model, tokens, block=block, edges=edges)
    return result


def position_edges(context: int) -> list[int]:
    """Position-bucket edges of a ``context``-token block: 0, 64, 256, 512, 2048, 4096 below ``context``, then
    ``context`` (the long-context tables' buckets)."""
    return [e for e in (0, 64, 256, 512, 2048, 4096) if e < context] + [context]


def position_perplexity(
    model: torch.nn.Module, tokens: torch.Tensor, *, block: int = 512, edges: Sequence[int] = (0, 64, 256, 512),
    batch_size: int = 4,
) -> dict:  # fmt: skip  # packed signature
    """Perplexity by token position: the stream cut into disjoint blocks of ``block`` tokens, each block
    scored from its own first token, the NLL pooled over blocks per position bucket.

    Bucket ``[a, b)`` holds the predictions of tokens at positions a..b−1 of a block (position 0 is never
    predicted), so it shows how a model uses a context of a to b tokens — where a sliding window or a
    linear far term matters. Partial last blocks are dropped.

    Args:
        model: a causal LM returning ``.logits`` ``(B, T, V)``.
        tokens: ``(N,)`` token ids, N ≥ ``block``.
        block: tokens per block (the context length measured).
        edges: increasing bucket edges, first 0, last ≤ ``block`` (e.g. ``(0, 64, 256, 512)``).
        batch_size: blocks per forward.

    Returns:
        ``{"block", "blocks", "tokens", "ppl", "block_nll", "buckets": {"a-b": {"ppl", "tokens", "block_nll"}}}``
        (``"a-b"`` names positions a..b inclusive; ``ppl`` over every scored position; ``block_nll``: the mean
        NLL of each block, for paired comparisons — :func:`paired_perplexity_ratio`).

    Raises:
        ValueError: fewer than ``block`` tokens, or edges not increasing from 0 within the block.
    """
    edges = [int(e) for e in edges]
    if len(edges) < 2 or edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])) or edges[-1] > block:
        raise ValueError(f"edges must increase from 0 to at most block={block}, got {edges}")
    tokens = tokens.reshape(-1).long()
    blocks = tokens.numel() // block
    if blocks < 1:
        raise ValueError(f"need at least block={block} tokens for position perplexity, got {tokens.numel()}")
    device = next(model.parameters()).device
    rows = []  # (blocks, block - 1) NLL by block and predicted position 1..block-1
    model.eval()
    with torch.no_grad():
        for start in range(0, blocks, batch_size):
            ids = tokens[start * block : min(blocks, start + batch_size) * block].view(-1, block).to(device)
            logits = model(ids, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)
            rows.append(loss.double().cpu())
    nll = torch.cat(rows)
    buckets = {}
    for a, b in zip(edges, edges[1:]):
        lo, hi = max(a, 1), b  # predicted positions lo..hi-1
        per_block = nll[:, lo - 1 : hi - 1].mean(1)
        buckets[f"{a}-{b - 1}"] = {
            "ppl": math.exp(float(per_block.mean())),
            "tokens": (hi - lo) * blocks,
            "block_nll": per_block.tolist(),
        }
    per_block = nll.mean(1)
    return {"block": block, "blocks": blocks, "tokens": (block - 1) * blocks, "ppl": math.exp(float(per_block.mean())),
            "block_nll": per_block.tolist(), "buckets": buckets}  # fmt: skip  # compact dict


def paired_perplexity_ratio(result: dict, reference: dict, bucket: str | None = None) -> dict:
    """Perplexity ratio of two :func:`position_perplexity` results on the same blocks, with its paired
    standard error over blocks.

    Every block holds the same number of scored tokens, so exp(mean over blocks of the NLL difference) is
    exactly the ratio of the two perplexities; the standard error of its log is the blocks' sample standard
    deviation of that difference / √blocks (blocks are disjoint stretches of text, treated as independent).
    Results whose blocks hold different token counts (``block_tokens``: whole documents,
    :func:`~lit_dof.evaluation.long_documents.long_document_perplexity`) are paired as a ratio of totals, the
    NLL differences weighted by tokens, with the standard error over blocks of
    :func:`~lit_dof.evaluation.stats.weighted_mean`: again exactly the ratio of the two perplexities.

    Args:
        result: an output of :func:`position_perplexity`.
        reference: another, on the same tokens and ``block`` (the ratio's denominator).
        bucket: a key of ``"buckets"`` (e.g. ``"256-511"``), or ``None`` for every scored position.

    Returns:
        ``{"ratio", "log_ratio", "stderr_log", "blocks"}``; ``ratio`` ≈ exp(log_ratio ± stderr_log); ``blocks``:
        those with scored tokens.

    Raises:
        ValueError: different blocks or token counts, fewer than 2 blocks, or results without ``block_nll``
            (older records).
    """
    a, b = (r if bucket is None else r["buckets"][bucket] for r in (result, reference))
    if "block_nll" not in a or "block_nll" not in b:
        raise ValueError("both results need per-block NLL ('block_nll'): measure them again with this version")
    if result["block"] != reference["block"] or len(a["block_nll"]) != len(b["block_nll"]) or len(a["block_nll"]) < 2:
        raise ValueError(
            f"the results must score the same ≥ 2 blocks, got {len(a['block_nll'])} blocks of "
            f"{result['block']} and {len(b['block_nll'])} of {reference['block']}"
        )
    from lit_dof.evaluation.stats import paired_difference, weighted_mean

    if "block_tokens" in a or "block_tokens" in b:
        if a.get("block_tokens") != b.get("block_tokens"):
            raise ValueError("the results score different tokens per document: measure both on the same documents, "
                             "split and max_tokens with the same tokenizer")  # fmt: skip  # one message
        diffs = [x - y if w else None for x, y, w in zip(a["block_nll"], b["block_nll"], a["block_tokens"])]
        log_ratio, stderr, blocks = weighted_mean(diffs, a["block_tokens"])
    else:
        log_ratio, stderr, blocks = paired_difference(a["block_nll"], b["block_nll"])
    return {"ratio": math.exp(log_ratio), "log_ratio": log_ratio, "stderr_log": stderr, "blocks": blocks}


def bucket_ratios(result: dict, reference: dict) -> dict[str, dict]:
    """:func:`paired_perplexity_ratio` of every scored position (``"all"``) and of each bucket, with ``stderr`` of
    the ratio (delta method: ratio × stderr_log).

    Args:
        result: a :func:`position_perplexity` (or long-document) result.
        reference: another on the same blocks (the denominator).

    Returns:
        ``{"all" | bucket: {"ratio", "log_ratio", "stderr_log", "blocks", "stderr"}}``; a long-document bucket that
        fewer than 2 documents reach is left out.

    Raises:
        ValueError: as :func:`paired_perplexity_ratio`.
    """
    out = {}
    for bucket in [None, *result["buckets"]]:
        if bucket is not None and result["buckets"][bucket].get("documents", 2) < 2:
            continue  # no standard error over documents
        paired = paired_perplexity_ratio(result, reference, bucket)
        out[bucket or "all"] = {**paired, "stderr": paired["ratio"] * paired["stderr_log"]}
    return out


def long_context_perplexity(
    model,
    tokenizer,
    path: str | os.PathLike,
    contexts: Sequence[int] = (512, 2048, 4096, 8192),
    max_tokens: int = 16384,
    split: str = "test",
) -> dict:
    """Perplexity by position in blocks of each context length on one split of a corpus (the ``long`` stage of
    ``lit-dof compare``).

    The split's documents are concatenated (EOS between them) and cut into disjoint blocks of ``context`` tokens,
    ``max_tokens`` tokens per context (at least one block); buckets by :func:`position_edges`. A block spans many
    short documents: this measures a long prefix of unrelated text; whole long documents are
    :func:`~lit_dof.evaluation.long_documents.long_document_perplexity`.

    Args:
        model: a causal LM (teacher or student).
        tokenizer: its tokenizer.
        path: the corpus (:func:`~lit_dof.data.sources.split_documents`).
        contexts: block lengths in tokens.
        max_tokens: tokens scored per context.
        split: ``"test"`` (default) or ``"validation"`` (the split of the records measured before the test split).

    Returns:
        ``{"contexts": {str(context): position_perplexity record}, "source": str(path), "split", "split_rule"}``.

    Raises:
        ValueError: an unknown split.
    """
    from lit_dof.data.sources import split_documents
    from lit_dof.data.splits import split_rule

    tokens = text_tokens(split_documents(path, split), tokenizer, max(max_tokens, max(contexts)))
    result: dict = {"contexts": {}, "source": str(path), "split": split, "split_rule": split_rule(split)}
    for context in contexts:
        usable = tokens[: max(context, max_tokens // context * context)]
        result["contexts"][str(context)] = position_perplexity(
            model, usable, block=context, edges=position_edges(context), batch_size=1
        )
    return result
