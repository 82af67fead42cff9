"""Which attention layers to make linear: the greedy replacement search of Distill-then-Replace (Xia et al.,
arXiv 2601.11667, §3.2; METHOD.md §6); the orderings that need no search are :mod:`lit_dof.hybrid.orderings`.

Everything here is model-agnostic: a **scorer** maps a set of linear layers (``frozenset[int]``; the
empty set is the teacher) to a task score, e.g. accuracy on validation items or perplexity on a text.

:func:`greedy_replacement` starts from the teacher; each round it scores every remaining single-layer swap
(or a shortlist of them), commits the best-scoring one if that hybrid is still within the tolerance of the
teacher, and stops otherwise. It returns the best-scoring hybrid met on the way and the most-linear hybrid
that passed. Rounds are reported to a callback as they finish and can be replayed from a saved trajectory
(resume without re-scoring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

Scorer = Callable[[frozenset], float]


def higher_is_better(metric: str) -> bool:
    """Whether a larger score of ``metric`` is the better one: every metric of a hybrid except ``perplexity``
    (accuracy, acc_norm). The one place that knows a metric's direction; :class:`Tolerance` applies it."""
    return metric != "perplexity"


@dataclass
class Tolerance:
    """When a hybrid's score is acceptable relative to the teacher's.

    Args:
        value: allowed loss of quality (≥ 0): absolute score units, or a fraction of the teacher's score.
        relative: ``value`` is a fraction of ``|teacher score|``.
        higher_is_better: accuracy (True) or perplexity/loss (False).

    Raises:
        ValueError: a negative ``value``.
    """

    value: float = 0.01
    relative: bool = False
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.value}")

    @classmethod
    def for_metric(cls, metric: str, value: float = 0.01, relative: bool = False) -> Tolerance:
        """The rule for scores of ``metric`` (its direction from :func:`higher_is_better`)."""
        return cls(value, relative, higher_is_better=higher_is_better(metric))

    def threshold(self, teacher: float) -> float:
        """The worst passing score: ``teacher`` moved by the tolerance in the losing direction.

        Args:
            teacher: the all-softmax teacher's score.

        Returns:
            ``teacher ∓ value`` (absolute) or ``teacher ∓ value·|teacher|`` (relative); ``−`` when higher is better.
        """
        margin = self.value * abs(teacher) if self.relative else self.value
        return teacher - margin if self.higher_is_better else teacher + margin

    def within(self, score: float, threshold: float) -> bool:
        """Whether ``score`` is on the passing side of ``threshold`` (equal passes)."""
        return score >= threshold if self.higher_is_better else score <= threshold

    def passes(self, score: float, teacher: float) -> bool:
        """Whether ``score`` is within the tolerance of the teacher's score ``teacher`` (the threshold passes)."""
        return self.within(score, self.threshold(teacher))

    def better(self, a: float, b: float) -> bool:
        """Whether score ``a`` is strictly better than score ``b`` in the metric's direction."""
        return a > b if self.higher_is_better else a < b

    def best(self, values: Iterable, key: Callable | None = None):
        """The best of ``values`` (by ``key``): ``max`` or ``min``, the first of equals."""
        return (max if self.higher_is_better else min)(values, key=key)


@dataclass
class Round:
    """One round of the search: the candidates scored, the layer chosen, and the hybrid after it."""

    index: int
    scores: dict[int, float]
    chosen: int | None
    score: float | None
    linear: list[int]
    passed: bool
    evaluations: int


@dataclass
class SearchResult:
    """Outcome of :func:`greedy_replacement`.

    ``best``: the best-scoring hybrid (≥ 1 linear layer) committed on the way, ties to the more linear;
    ``most_linear``: the last committed hybrid, i.e. the most linear one within the tolerance. Both are the
    teacher, ``frozenset()``, when no swap passed. ``evaluations``: scorer calls made by this run.
    """

    teacher_score: float
    threshold: float
    rounds: list[Round] = field(default_factory=list)
    best: frozenset = frozenset()
    best_score: float | None = None
    most_linear: frozenset = frozenset()
    most_linear_score: float | None = None
    evaluations: int = 0


def greedy_replacement(
    layers: Iterable[int],
    scorer: Scorer,
    tolerance: Tolerance,
    *,
    shortlist: Callable[[frozenset, list[int]], list[int]] | None = None,
    max_linear: int | None = None,
    teacher_score: float | None = None,
    resume: Sequence[Round] = (),
    on_round: Callable[[Round], None] | None = None,
) -> SearchResult:
    """Distill-then-Replace's greedy search (arXiv 2601.11667, §3.2).

    Args:
        layers: the candidate layers (e.g. every linearisable attention layer).
        scorer: score of a hybrid given its set of linear layers.
        tolerance: acceptance rule relative to the teacher's score.
        shortlist: ``(current linear set, remaining layers) → candidates`` to score this round (e.g. the
            top-k by local distillation loss or by DoF); ``None``: every remaining layer.
        max_linear: stop after this many swaps.
        teacher_score: the teacher's score if already known (saves one evaluation).
        resume: rounds saved by an earlier run, in order: their choices are replayed without scoring, and the
            search continues after them.
        on_round: called with each finished round (persist it to resume later).

    Returns:
        :class:`SearchResult`.

    Raises:
        ValueError: no candidate layers, or a resumed round that chose a layer not among them.
    """
    remaining = list(dict.fromkeys(layers))
    if not remaining:
        raise ValueError("no candidate layers to replace")
    evaluations = 0
    if teacher_score is None:
        teacher_score = scorer(frozenset())
        evaluations += 1
    # Until a swap passes, both answers are the teacher itself.
    result = SearchResult(
        teacher_score=teacher_score,
        threshold=tolerance.threshold(teacher_score),
        best=frozenset(),
        best_score=teacher_score,
        most_linear=frozenset(),
        most_linear_score=teacher_score,
    )
    found_hybrid = False
    current: frozenset = frozenset()

    def record(round_: Round) -> None:
        nonlocal current, found_hybrid
        result.rounds.append(round_)
        if not round_.passed or round_.chosen is None:
            return
        current = current | {round_.chosen}
        remaining.remove(round_.chosen)
        result.most_linear, result.most_linear_score = current, round_.score
        if not found_hybrid or not tolerance.better(result.best_score, round_.score):
            result.best, result.best_score = current, round_.score  # ties go to the more linear hybrid
        found_hybrid = True

    for round_ in resume:
        if round_.passed and round_.chosen not in remaining:
            raise ValueError(f"resumed round {round_.index} chose layer {round_.chosen}, not a remaining candidate")
        record(round_)
        if not round_.passed:
            result.evaluations = evaluations
            return result
    while remaining and (max_linear is None or len(current) < max_linear):
        candidates = shortlist(current, list(remaining)) if shortlist else list(remaining)
        candidates = [c for c in candidates if c in remaining]
        if not candidates:
            break
        scores = {c: scorer(current | {c}) for c in candidates}
        evaluations += len(candidates)
        chosen = candidates[0]
        for c in candidates[1:]:
            if tolerance.better(scores[c], scores[chosen]):
                chosen = c
        passed = tolerance.passes(scores[chosen], teacher_score)
        round_ = Round(
            index=len(result.rounds),
            scores=scores,
            chosen=chosen if passed else None,
            score=scores[chosen] if passed else None,
            linear=sorted(current | {chosen}) if passed else sorted(current),
            passed=passed,
            evaluations=len(candidates),
        )
        record(round_)
        if on_round is not None:
            on_round(round_)
        if not passed:
            break
    result.evaluations = evaluations
    return result
