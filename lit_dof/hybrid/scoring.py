"""Scorers of hybrids for :func:`~lit_dof.hybrid.search.greedy_replacement`: a student with a bank of linear
twins is switched to a given set of linear layers and scored on fixed validation data, reusing the teacher's
cached prefix (:mod:`lit_dof.hybrid.prefix`) so that only layers from the first linear one onwards run.

Metrics: ``"accuracy"`` on multiple-choice items (lm-eval's ``acc``: argmax of summed option
log-likelihoods, :mod:`lit_dof.evaluation.multiple_choice`) and ``"acc_norm"`` (lm-eval's ``acc_norm``: argmax of
log-likelihood per character of the option) — higher is better; ``"perplexity"`` on token blocks — lower
is better; ``"recall"`` on recall items (:mod:`lit_dof.hybrid.recall_items`): the share whose answer every argmax
gets right — higher is better.
"""

from __future__ import annotations

import math
import time
from typing import Literal

import torch

from lit_dof.evaluation.multiple_choice import collate_choices, option_pairs, option_scores_from_logits, score_matrix
from lit_dof.hybrid.prefix import PrefixCache
from lit_dof.hybrid.recall_items import recalled
from lit_dof.hybrid.search import higher_is_better

Metric = Literal["accuracy", "acc_norm", "perplexity", "recall"]
METRICS = ("accuracy", "acc_norm", "perplexity", "recall")


class HybridScorer:
    """``scorer(linear_layers) -> score`` for a :class:`~lit_dof.students.LitDofForCausalLM` student.

    Args:
        student: the student holding a linear twin for every candidate layer.
        batches: for ``"accuracy"`` batches from :func:`~lit_dof.evaluation.multiple_choice.collate_choices`; for
            ``"perplexity"`` ``{"input_ids": (B, T)}`` blocks; for ``"recall"`` the items of
            :func:`~lit_dof.hybrid.recall_items.recall_blocks`.
        metric: ``"accuracy"``, ``"acc_norm"``, ``"perplexity"`` or ``"recall"``.
        prefix_cache: reuse the teacher's hidden states before the first linear layer (exact in float32;
            built on the first call that needs it).

    Attributes:
        evaluations: scorer calls so far. seconds: time spent in them.

    Raises:
        ValueError: an unknown metric, or a layer index outside the model.
    """

    def __init__(self, student, batches: list[dict], metric: Metric = "accuracy", prefix_cache: bool = True) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        self.student, self.batches, self.metric = student, batches, metric
        self.num_layers = len(student.linear_layers)
        self.inputs = [{"input_ids": b["input_ids"]} for b in batches]
        self.prefix_cache = prefix_cache
        self._cache: PrefixCache | None = None
        self.evaluations, self.seconds = 0, 0.0

    @property
    def cache(self) -> PrefixCache | None:
        """The teacher's hidden states for these batches, built on first use (a resumed search that finds
        every score already measured never pays for it); ``None`` without ``prefix_cache``."""
        if self.prefix_cache and self._cache is None:
            self._cache = PrefixCache(self.student, self.inputs)
        return self._cache

    @property
    def higher_is_better(self) -> bool:
        """Whether a larger score is better (:func:`~lit_dof.hybrid.search.higher_is_better`)."""
        return higher_is_better(self.metric)

    def _logits(self, index: int, first_linear: int | None) -> torch.Tensor:
        if self.prefix_cache and first_linear is not None and first_linear > 0:
            return self.cache.logits(self.student, index, first_linear)
        with torch.no_grad():
            return self.student(**self.inputs[index], use_cache=False).logits

    def __call__(self, linear: frozenset) -> float:
        """Score the hybrid whose layers ``linear`` run their linear twins (all others softmax).

        Args:
            linear: indices of the layers switched to linear attention, each in ``0..num_layers - 1``.

        Returns:
            the metric over the scorer's batches: accuracy (``acc``/``acc_norm``), perplexity or recall.

        Raises:
            ValueError: a layer index outside the student.
        """
        bad = [i for i in linear if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"layer indices {bad} outside 0..{self.num_layers - 1}")
        start = time.perf_counter()
        self.student.set_softmax_layers([i for i in range(self.num_layers) if i not in linear])
        first = min(linear) if linear else None
        hits = total = 0
        nll, tokens = 0.0, 0
        for index, batch in enumerate(self.batches):
            logits = self._logits(index, first)
            if self.metric == "recall":
                hits, total = hits + recalled(logits, batch), total + 1
            elif self.metric != "perplexity":
                scores = option_scores_from_logits(logits, batch)
                if self.metric == "acc_norm":
                    scores = scores / batch["lengths"].clamp_min(1)
                matrix = score_matrix(scores, batch)
                hits += int((matrix.argmax(-1) == batch["gold"]).sum())
                total += len(batch["gold"])
            else:
                ids = batch["input_ids"]
                flat = logits[:, :-1].float().reshape(-1, logits.shape[-1])
                nll += float(torch.nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1), reduction="sum"))
                tokens += ids[:, 1:].numel()
        self.evaluations += 1
        self.seconds += time.perf_counter() - start
        return hits / max(1, total) if self.metric != "perplexity" else math.exp(nll / max(1, tokens))


def choice_batches(docs: list[dict], tokenizer, batch_size: int = 8, max_length: int = 512) -> list[dict]:
    """Multiple-choice items in scorer batches (:func:`~lit_dof.evaluation.multiple_choice.collate_choices`), grouped
    by length so that little of each batch is padding (accuracy does not depend on the grouping)."""
    size = [sum(len(c) + len(o) for c, o in option_pairs(doc)) for doc in docs]
    docs = [docs[i] for i in sorted(range(len(docs)), key=lambda i: size[i])]
    return [collate_choices(docs[i : i + batch_size], tokenizer, max_length) for i in range(0, len(docs), batch_size)]
