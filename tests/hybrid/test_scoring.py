"""Hybrid scorers: the prefix-cached score equals the uncached one for every hybrid; a greedy search runs on
a real (tiny) model."""

from __future__ import annotations

import itertools

import pytest
import torch

from lit_dof.attention import LearnedPRF
from lit_dof.hybrid.scoring import HybridScorer, choice_batches
from lit_dof.hybrid.search import Tolerance, greedy_replacement
from lit_dof.students import linearize
from tests.conftest import REPO, TINYSTORIES

DATA = REPO.parent / "shared" / "data"


def _student():
    from lit_dof.teacher.loading import load_teacher

    torch.manual_seed(0)
    teacher, tokenizer = load_teacher(TINYSTORIES)
    return linearize(teacher, LearnedPRF, 8).eval(), tokenizer


def test_perplexity_scorer_cached_equals_uncached_and_teacher():
    student, tokenizer = _student()
    batches = [{"input_ids": torch.randint(5, 2000, (2, 24))} for _ in range(2)]
    cached, plain = (
        HybridScorer(student, batches, "perplexity"),
        HybridScorer(student, batches, "perplexity", prefix_cache=False),
    )
    L = cached.num_layers
    # the cache is built on the first call that starts past layer 0, not before
    cached(frozenset()), cached(frozenset({0}))
    assert cached._cache is None
    cached(frozenset({1}))
    assert cached._cache is not None and plain.cache is None
    cached.evaluations = 0
    for k in range(L + 1):
        for linear in itertools.combinations(range(L), k):
            assert cached(frozenset(linear)) == pytest.approx(plain(frozenset(linear)), rel=1e-5)
    with student.teacher_mode(), torch.no_grad():
        logits = torch.cat([student(**b).logits for b in batches])
    ids = torch.cat([b["input_ids"] for b in batches])
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    assert cached(frozenset()) == pytest.approx(float(nll.exp()), rel=1e-5)
    assert cached.evaluations == 2**L + 1 and not cached.higher_is_better
    with pytest.raises(ValueError, match="outside"):
        cached(frozenset({L}))


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_accuracy_scorer_drives_a_greedy_search():
    from lit_dof.evaluation import task_data

    student, tokenizer = _student()
    batches = choice_batches(task_data.arc_easy(DATA)[:12], tokenizer, batch_size=6)
    cached, plain = HybridScorer(student, batches), HybridScorer(student, batches, prefix_cache=False)
    for linear in (frozenset(), frozenset({1}), frozenset({0, 1})):
        assert cached(linear) == plain(linear)
    before = cached.evaluations
    result = greedy_replacement(range(cached.num_layers), cached, Tolerance(1.0))  # accept anything: all linear
    assert result.most_linear == set(range(cached.num_layers)) and cached.evaluations - before == result.evaluations
