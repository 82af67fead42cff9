"""Perplexity of whole long documents by in-document position: the long-document test set
(:mod:`lit_dof.data.splits`, never trained on nor used for validation), each document scored as one sequence
from its first token, so that position p of a bucket is p tokens into a real article — long-range modelling,
not robustness to a prefix of unrelated text (what
:func:`~lit_dof.evaluation.position_perplexity.long_context_perplexity` measures with concatenated short documents).

Each document's tokens (no special tokens, no EOS) are truncated to ``max_tokens`` (default: the model's
``max_position_embeddings``, at most the last bucket edge) and scored in one forward by
:func:`~lit_dof.evaluation.position_perplexity.position_perplexity` (one block of the document's length). Bucket
``[a, b)`` holds the predictions of positions a..b−1 counted from the document's start (position 0 is never
predicted); a document shorter than b fills the bucket partly, one shorter than a + 1 not at all. Per bucket, the
perplexity is exp(total NLL / total tokens) over documents, with the standard error of its log over documents
(the documents are the unit, not the tokens: :func:`~lit_dof.evaluation.stats.weighted_mean`); two models'
records pair document by document (:func:`~lit_dof.evaluation.position_perplexity.paired_perplexity_ratio`,
:func:`~lit_dof.evaluation.position_perplexity.bucket_ratios`: student / teacher, student / control).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence

import torch

from lit_dof.evaluation.position_perplexity import position_perplexity
from lit_dof.evaluation.stats import weighted_mean

DOCUMENT_EDGES = (0, 64, 512, 2048, 4096, 8192)
"""In-document position buckets: 0–63, 64–511, 512–2047, 2048–4095, 4096–8191."""


def max_positions(model) -> int | None:
    """The model's ``max_position_embeddings`` (of its text config), or ``None`` where it has none.

    Args:
        model: a transformers model (teacher or student).
    """
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return getattr(text, "max_position_embeddings", None)


def _edges(edges: Sequence[int], limit: int) -> list[int]:
    """``edges`` below ``limit``, then ``limit`` (the last bucket cut at the truncation)."""
    return [e for e in edges if e < limit] + [limit]


def document_nll(model, ids: torch.Tensor, edges: Sequence[int]) -> tuple[tuple[float, int], list[tuple]]:
    """One document's NLL by in-document position bucket.

    Args:
        model: a causal LM returning ``.logits`` ``(B, T, V)``.
        ids: ``(n,)`` the document's token ids, 2 ≤ n ≤ ``edges[-1]``.
        edges: increasing bucket edges from 0 (the last ≥ n).

    Returns:
        ``((mean NLL, tokens) of every scored position, [(mean NLL or None, tokens) per bucket])``: tokens are the
        predictions (positions ≥ 1) the document has in the bucket, 0 (and ``None``) past its end.
    """
    n = ids.numel()
    cut = _edges(edges, n)
    result = position_perplexity(model, ids, block=n, edges=cut, batch_size=1)
    scored = [(b["block_nll"][0], b["tokens"]) for b in result["buckets"].values()]
    return (result["block_nll"][0], result["tokens"]), scored + [(None, 0)] * (len(edges) - len(cut))


def _summary(nll: list, tokens: list[int]) -> dict:
    """A bucket's record: perplexity of the totals, the SE of its log over documents (``None`` under 2)."""
    documents = sum(t > 0 for t in tokens)
    if documents >= 2:
        mean, stderr, _ = weighted_mean(nll, tokens)
    else:  # one document (its own mean) or none
        mean, stderr = next((v for v, t in zip(nll, tokens) if t), None), None
    ppl = math.exp(mean) if mean is not None else None
    return {
        "ppl": ppl,
        "stderr_log": stderr,
        "stderr": ppl * stderr if stderr is not None else None,
        "tokens": sum(tokens),
        "documents": documents,
        "block_nll": nll,
        "block_tokens": tokens,
    }


def long_document_perplexity(
    model,
    tokenizer,
    source,
    *,
    split: str = "long",
    max_tokens: int | None = None,
    max_documents: int | None = None,
    edges: Sequence[int] = DOCUMENT_EDGES,
    val_every: int = 100,
    command: Sequence[str] | None = None,
    progress: bool = True,
) -> dict:
    """Perplexity of the long-document test set (or another split) by in-document position bucket.

    Args:
        model: a causal LM returning ``.logits`` ``(B, T, V)`` (teacher or student).
        tokenizer: its tokenizer.
        source: a local corpus file, or a :class:`~lit_dof.data.sources.LocalDocuments` /
            :class:`~lit_dof.data.sources.HubDocuments` (the same documents from the hub stream).
        split: ``"long"`` (default) or another split of :mod:`lit_dof.data.splits`.
        max_tokens: tokens scored per document from its start (default: the model's ``max_position_embeddings``);
            never more than ``edges[-1]``.
        max_documents: the first this many documents of the split, in corpus order (``None``: all of them).
        edges: increasing bucket edges from 0 (default :data:`DOCUMENT_EDGES`).
        val_every: the validation modulus (documents of validation are never in the other splits).
        command: the command recorded in the provenance (default: this process's ``sys.argv``).
        progress: print one line per document on stderr (:class:`~lit_dof.progress.Progress`).

    Returns:
        ``{"kind": "long_documents", "split", "split_rule", "source", "documents", "max_documents", "block"
        (= ``max_tokens``, the truncation), "max_tokens", "edges", "document_tokens" (each document's length before
        truncation), "tokens", "ppl", "stderr_log", "stderr", "block_nll", "block_tokens", "buckets": {"a-b":
        {"ppl", "stderr_log", "stderr", "tokens", "documents", "block_nll", "block_tokens"}}, "provenance":
        {"versions", "command"}}``:
        ``block_nll`` / ``block_tokens`` are per document (mean NLL in nats, scored tokens), ``stderr_log`` the
        standard error of log ppl over documents, ``stderr`` ≈ ppl × ``stderr_log``; a bucket no document reaches
        has ``ppl`` ``None``.

    Raises:
        ValueError: edges not increasing from 0, ``max_tokens`` < 2, an unknown split, or fewer than 2 documents
            of at least 2 tokens (the message names the split and the source).
    """
    from lit_dof.data.sources import split_documents
    from lit_dof.data.splits import split_rule
    from lit_dof.io import library_versions, portable
    from lit_dof.progress import Progress

    edges = [int(e) for e in edges]
    if len(edges) < 2 or edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must increase from 0, got {edges}")
    limit = min(max_tokens or max_positions(model) or edges[-1], edges[-1])
    if limit < 2:
        raise ValueError(f"max_tokens={limit}: a document needs at least 2 scored positions; raise --max_tokens")
    edges = _edges(edges, limit)
    texts = list(itertools.islice(split_documents(source, split, val_every), max_documents))
    lengths, per_document = [], []
    bar = Progress("long documents", len(texts), "document") if progress else None
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) < 2:
            continue  # nothing to predict
        if bar:
            bar.begin(f"{min(len(ids), limit)} of {len(ids)} tokens")
        lengths.append(len(ids))
        per_document.append(document_nll(model, torch.tensor(ids[:limit]), edges))
    if len(per_document) < 2:
        raise ValueError(
            f"the {split} split of {source} has {len(per_document)} documents of ≥ 2 tokens (max_documents="
            f"{max_documents}): a standard error over documents needs at least 2; use a larger corpus or split"
        )
    if bar:
        bar.end(f"{len(per_document)} documents")
    overall = _summary([d[0][0] for d in per_document], [d[0][1] for d in per_document])
    buckets = {
        f"{a}-{b - 1}": _summary([d[1][k][0] for d in per_document], [d[1][k][1] for d in per_document])
        for k, (a, b) in enumerate(zip(edges, edges[1:]))
    }
    command = portable(command if command is not None else [sys.executable, *sys.argv])
    return {
        "kind": "long_documents",
        "split": split,
        "split_rule": split_rule(split, val_every),
        "source": str(source),
        "documents": len(per_document),
        "max_documents": max_documents,
        "block": limit,
        "max_tokens": limit,
        "edges": edges,
        "document_tokens": lengths,
        **overall,
        "buckets": buckets,
        "provenance": {"versions": library_versions(), "command": command},
    }
