"""Perplexity by token position: disjoint blocks scored each from its own first token, NLL per position bucket and
per block (:func:`position_perplexity`), two models' ratio paired block by block (:func:`paired_perplexity_ratio`,
:func:`bucket_ratios`), and the records of one split of a corpus that carry it: the held-out record, sliding-window
perplexity with its perplexity by position (:func:`heldout_perplexity`, the ``ppl`` stage of ``lit-dof compare``), and
blocks of long contexts (:func:`long_context_perplexity`, the ``long`` stage). Sliding-window perplexity:
:mod:`lit_dof.evaluation.perplexity`.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import torch

from lit_dof.evaluation.perplexity import stream_perplexity, text_tokens


def position_edges(context: int) -> list[int]:
    """Position-bucket edges of a ``context``-token block: 0, 64, 256, 512, 2048, 4096 below ``context``, then
    ``context`` (the long-context tables' buckets)."""
    return [e for e in (0, 64, 256, 512, 2048, 4096) if e < context] + [context]


NLL_CHUNK = 1024
"""Positions per log-softmax in :func:`next_token_nll`."""


def next_token_nll(logits: torch.Tensor, ids: torch.Tensor, chunk: int = NLL_CHUNK) -> torch.Tensor:
    """The NLL of each next token, its log-softmax taken over ``chunk`` positions at a time: the peak is the logits
    and one chunk's float32 log-probabilities, not a second ``(B, T, V)`` tensor (8.6 GB for one 8192-token
    document of Gemma 3's 262,144-token vocabulary).

    Args:
        logits: ``(B, T, V)`` a causal LM's logits for ``ids``.
        ids: ``(B, T)`` the token ids.
        chunk: positions per log-softmax (≥ 1).

    Returns:
        ``(B, T − 1)`` float32: −log p(ids[:, t + 1] | ids[:, ≤ t]).
    """
    parts = []
    for start in range(0, ids.shape[1] - 1, chunk):
        stop = min(start + chunk, ids.shape[1] - 1)
        part = logits[:, start:stop].float().transpose(1, 2)
        parts.append(torch.nn.functional.cross_entropy(part, ids[:, start + 1 : stop + 1], reduction="none"))
    return torch.cat(parts, 1)


def position_perplexity(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    *,
    block: int = 512,
    edges: Sequence[int] = (0, 64, 256, 512),
    batch_size: int = 4,
) -> dict:
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
            rows.append(next_token_nll(model(ids, use_cache=False).logits, ids).double().cpu())
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
    return {
        "block": block,
        "blocks": blocks,
        "tokens": (block - 1) * blocks,
        "ppl": math.exp(float(per_block.mean())),
        "block_nll": per_block.tolist(),
        "buckets": buckets,
    }


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
            raise ValueError(
                "the results score different tokens per document: measure both on the same documents, "
                "split and max_tokens with the same tokenizer"
            )
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


def heldout_perplexity(
    model,
    tokenizer,
    path: str | os.PathLike,
    *,
    max_tokens: int = 16384,
    window: int = 512,
    stride: int | None = 256,
    split: str = "test",
) -> dict:
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
    result = stream_perplexity(model, tokens, path, split, window=window, stride=stride, batch_size=4)
    block = min(window, tokens.numel())  # a stream shorter than the window is one block
    edges = [e for e in (0, 64, 256) if e < block] + [block]
    result["by_position"] = position_perplexity(model, tokens, block=block, edges=edges)
    return result


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
