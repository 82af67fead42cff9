"""Recall items and the ``recall`` metric of ``lit-dof hybrid`` (issue #45, item 4): each item is a block of
held-out text with one fact at a seeded depth and its question and answer at the end; the scorer's recall equals a
token-by-token exact-match check of the answer, cached or not; a search on it runs, reports and verifies on later
blocks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_dof.hybrid.recall_items import recall_blocks, recalled
from lit_dof.hybrid.scoring import HybridScorer
from tests.conftest import TINYSTORIES, WIKIPEDIA, load_script
from tests.hybrid.test_cli import bank, needs_data  # noqa: F401  (the module-scoped bank fixture)


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINYSTORIES)


@needs_data
def test_items_hold_one_fact_and_end_in_its_question_and_answer():
    tokenizer = _tokenizer()
    search, confirm, heldout, where = recall_blocks(WIKIPEDIA, tokenizer, 96, 3, 2, confirm_items=1, seed=4)
    assert (len(search), len(confirm), len(heldout)) == (3, 1, 2) and "recall items" in where
    items = search + confirm + heldout
    fillers = set()
    for item in items:
        ids = item["input_ids"][0]
        assert ids.shape == (96,)
        start, stop = item["answer"]
        text = tokenizer.decode(ids)
        code = tokenizer.decode(ids[start:stop]).strip()
        assert stop == 96 and code.isdigit() and len(code) == 5
        owner = text[: text.rindex(" The locker code of")].rsplit(" The locker code of ", 1)  # the fact, then filler
        assert f" is {code}." in owner[1] and tokenizer.decode(ids[:start]).endswith("is")
        assert 0.1 <= item["depth"] <= 0.9
        fact = tokenizer.decode(ids[item["fact"] : item["fact_end"]])
        assert fact.strip().startswith("The locker code of") and fact.endswith(f" is {code}.")  # the fact's tokens
        fillers.add(tokenizer.decode(ids[:8]))
    assert len(fillers) == len(items)  # every item its own block of filler
    again = recall_blocks(WIKIPEDIA, tokenizer, 96, 3, 2, confirm_items=1, seed=4)[0]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(search, again))
    other = recall_blocks(WIKIPEDIA, tokenizer, 96, 3, 2, confirm_items=1, seed=5)[0]
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(search, other))
    later = recall_blocks(WIKIPEDIA, tokenizer, 96, 0, 2, skip=6, seed=4)[2]  # verification: after every other
    assert not any(torch.equal(a["input_ids"][0, :8], b["input_ids"][0, :8]) for a in items for b in later)
    with pytest.raises(ValueError, match="use a larger block"):
        recall_blocks(WIKIPEDIA, tokenizer, 12, 1, 1)


@needs_data
def test_recall_metric_is_the_answers_exact_match_cached_or_not(bank):  # noqa: F811
    from lit_dof.students import load_student

    student, tokenizer = load_student(bank).eval(), _tokenizer()
    items = recall_blocks(WIKIPEDIA, tokenizer, 64, 4, 1)[0]
    cached, plain = HybridScorer(student, items, "recall"), HybridScorer(student, items, "recall", prefix_cache=False)
    for linear in (frozenset(), frozenset({1}), frozenset({0, 1})):
        student.set_softmax_layers([i for i in range(2) if i not in linear])
        with torch.no_grad():
            expected = 0
            for item in items:
                logits = student(item["input_ids"], use_cache=False).logits
                start, stop = item["answer"]
                expected += all(
                    int(logits[0, t - 1].argmax()) == int(item["input_ids"][0, t]) for t in range(start, stop)
                )
        assert cached(linear) == plain(linear) == expected / len(items)
    logits = torch.zeros(1, 64, 100)
    item = {"input_ids": torch.arange(64)[None] % 100, "answer": (62, 64)}
    logits[0, 61, 62], logits[0, 62, 63] = 1.0, 1.0
    assert recalled(logits, item)
    logits[0, 62, 5] = 2.0
    assert not recalled(logits, item)


@needs_data
def test_a_search_on_recall_runs_and_verifies(bank, tmp_path):  # noqa: F811
    from lit_dof.hybrid.run import HybridSearch

    record = HybridSearch(
        str(bank),
        metric="recall",
        corpus=str(WIKIPEDIA),
        block=64,
        search_items=3,
        heldout_items=2,
        tolerance=1.0,  # every hybrid passes: the search runs to the all-linear model
        shortlist=None,
        out=str(tmp_path / "s"),
        orderings=["uniform"],
        verify_items=2,
    ).run()
    assert record.settings.metric == "recall" and record.settings.task is None
    assert "recall items" in record.items and 0 <= record.teacher_search_score <= 1
    assert record.verify.items == 2 and 0 <= record.verify.scores["teacher"].score <= 1


@needs_data
def test_the_tools_prompt_stops_at_the_question_and_points_at_the_facts_code():
    tool, probe = load_script("far_cache_positions", "tools"), load_script("recall_probe", "tools")
    tokenizer = _tokenizer()
    item = recall_blocks(WIKIPEDIA, tokenizer, 96, 0, 3)[2][2]
    ids, positions, code = tool.recall_prompt(tokenizer, WIKIPEDIA, 96, 2)
    start, stop = item["answer"]
    assert torch.equal(ids, item["input_ids"][:, :start])
    assert code == tokenizer.decode(item["input_ids"][0, start:stop]).strip() and len(code) == 5
    assert positions == list(range(positions[0], positions[-1] + 1)) and positions[-1] < start - 5
    assert tokenizer.decode(ids[0, positions]).strip().removesuffix(".") == code  # the fact's own digits

    class Oracle(torch.nn.Module):  # predicts every next token, or the token itself (a copy one step late)
        def __init__(self, late):
            super().__init__()
            self.late = late

        def forward(self, ids):
            nxt = ids if self.late else torch.cat([ids[:, 1:], ids[:, -1:]], 1)
            return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, tokenizer.vocab_size).float())

    items = recall_blocks(WIKIPEDIA, tokenizer, 96, 0, 3)[2]
    assert probe.recall(Oracle(False), items) == [True] * 3 and probe.recall(Oracle(True), items) == [False] * 3
