"""Greedy replacement against deterministic fake scorers with known optima; orderings."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from lit_dof.hybrid.orderings import dof_order, loss_order, random_order, uniform_order
from lit_dof.hybrid.search import Round, Tolerance, greedy_replacement, higher_is_better

COST = {0: 0.05, 1: 0.001, 2: 0.02, 3: 0.003, 4: 0.5}


def additive(linear: frozenset) -> float:
    return 1.0 - sum(COST[i] for i in linear)


def largest_feasible(tolerance: float) -> int:
    """Brute force: the most layers any hybrid can make linear within the tolerance."""
    return max(
        k
        for k in range(len(COST) + 1)
        for s in itertools.combinations(COST, k)
        if additive(frozenset(s)) >= 1 - tolerance
    )


def test_greedy_finds_the_known_optimum_and_stops():
    calls = []

    def scorer(linear):
        calls.append(linear)
        return additive(linear)

    result = greedy_replacement(COST, scorer, Tolerance(0.03))
    assert [r.chosen for r in result.rounds] == [1, 3, 2, None]  # cheapest first; layer 0 would cost 0.05
    assert result.most_linear == {1, 2, 3} and len(result.most_linear) == largest_feasible(0.03)
    assert result.most_linear_score == pytest.approx(0.976)
    assert result.best == {1} and result.best_score == pytest.approx(0.999)  # every swap costs: 1 layer scores best
    assert result.evaluations == len(calls) == 1 + 5 + 4 + 3 + 2 and not result.rounds[-1].passed
    assert result.threshold == pytest.approx(0.97)


def test_best_hybrid_can_beat_the_teacher_and_ties_prefer_more_linear():
    delta = {0: -0.5, 1: -0.125, 2: 0.25, 3: 0.0, 4: -1.0}  # exact binary fractions: ties are exact
    # swapping layer 2 helps (e.g. a task-specific twin); layer 3 is free

    def scorer(linear):
        return 1.0 + sum(delta[i] for i in linear)

    result = greedy_replacement(COST, scorer, Tolerance(0.0))  # nothing worse than the teacher allowed
    assert [r.chosen for r in result.rounds] == [2, 3, 1, None]
    assert result.best == {2, 3} and result.best_score == 1.25  # ties with {2}: the more linear wins
    assert result.most_linear == {1, 2, 3} and result.most_linear_score == 1.125


def test_lower_is_better_relative_tolerance_shortlist_and_max_linear():
    def perplexity(linear):
        value = 10.0
        for i in linear:
            value *= 1 + COST[i]
        return value

    result = greedy_replacement(COST, perplexity, Tolerance(0.05, relative=True, higher_is_better=False))
    assert result.threshold == pytest.approx(10.5) and result.most_linear == {1, 2, 3}
    proxy = {0: 3.0, 1: 1.0, 2: 2.0, 3: 0.5, 4: 9.0}  # e.g. local distillation loss

    def top2(current, remaining):
        return sorted(remaining, key=proxy.get)[:2]

    short = greedy_replacement(COST, perplexity, Tolerance(0.05, True, False), shortlist=top2, teacher_score=10.0)
    assert short.most_linear == {1, 2, 3} and short.evaluations == 2 + 2 + 2 + 2 < 5 + 4 + 3 + 2
    capped = greedy_replacement(COST, perplexity, Tolerance(0.05, True, False), max_linear=1)
    assert capped.most_linear == {1} and len(capped.rounds) == 1
    nothing = greedy_replacement([4], perplexity, Tolerance(0.05, True, False))
    assert nothing.most_linear == nothing.best == frozenset() and nothing.best_score == 10.0


def test_resume_replays_saved_rounds_without_scoring():
    saved = []
    full = greedy_replacement(COST, additive, Tolerance(0.03), on_round=saved.append)
    calls = []

    def scorer(linear):
        calls.append(linear)
        return additive(linear)

    resumed = greedy_replacement(COST, scorer, Tolerance(0.03), resume=saved[:2], teacher_score=1.0)
    assert resumed.most_linear == full.most_linear and resumed.best == full.best
    assert len(calls) == 3 + 2 and all({1, 3} <= c for c in calls)  # only rounds 3 and 4 were scored
    with pytest.raises(ValueError, match="not a remaining candidate"):
        greedy_replacement(COST, scorer, Tolerance(0.03), resume=[replace(saved[0], chosen=7)], teacher_score=1.0)
    with pytest.raises(ValueError, match="tolerance"):
        Tolerance(-0.1)
    assert isinstance(saved[0], Round) and saved[0].chosen == 1


def test_a_metric_s_direction_is_applied_by_its_tolerance():
    assert higher_is_better("accuracy") and higher_is_better("acc_norm") and not higher_is_better("perplexity")
    accuracy, ppl = Tolerance.for_metric("accuracy", 0.1), Tolerance.for_metric("perplexity", 0.1, relative=True)
    assert accuracy == Tolerance(0.1) and ppl == Tolerance(0.1, relative=True, higher_is_better=False)
    assert accuracy.within(0.5, 0.5) and accuracy.within(0.6, 0.5) and not accuracy.within(0.4, 0.5)
    assert ppl.within(10.0, 10.0) and ppl.within(9.0, 10.0) and not ppl.within(11.0, 10.0)
    assert accuracy.best([0.2, 0.7, 0.7]) == 0.7 and ppl.best([12.0, 9.0, 30.0]) == 9.0
    means = {"dof": 0.5, "loss": 0.7, "uniform": 0.7}
    assert accuracy.best(means, key=means.get) == "loss" and ppl.best(means, key=means.get) == "dof"


def test_orderings():
    assert dof_order({0: 150.0, 1: 20.0, 2: 20.0, 3: 5.0}) == [3, 1, 2, 0]
    assert loss_order({5: 0.3, 6: 0.1}) == [6, 5]
    order = uniform_order(list(range(30)))
    assert sorted(order) == list(range(30)) and order[:3] == [14, 0, 29]
    for k in (4, 8, 15):  # every prefix is spread: no gap between chosen layers is much wider than 30 / k
        chosen = sorted(order[:k])
        assert max(b - a for a, b in zip(chosen, chosen[1:])) <= 2 * 30 / (k - 1) + 1
    assert random_order(range(10), seed=3) == random_order(range(10), seed=3) != list(range(10))
