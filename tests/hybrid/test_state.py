"""``search.json``: hybrid keys, resuming with the same settings only, memoised scores, score sets by size."""

from __future__ import annotations

import json

import pytest

from lit_dof.hybrid.search import Round
from lit_dof.hybrid.state import SearchState, hybrid_key


def test_hybrid_key():
    assert hybrid_key([3, 1, 10]) == "1,3,10" and hybrid_key(()) == "teacher"


def test_state_resumes_with_the_same_settings_and_refuses_others(tmp_path):
    path = tmp_path / "search.json"
    state = SearchState(path, {"metric": "accuracy", "seed": 0})
    assert state.data == {"settings": {"metric": "accuracy", "seed": 0}, "rounds": [], "heldout": {}, "timing": {}}
    calls = []
    score = state.memoised(state.data["heldout"], lambda linear: calls.append(linear) or len(linear) / 10)
    assert score([2, 1]) == 0.2 and score((1, 2)) == 0.2 and calls == [frozenset({1, 2})]
    state.add_round(Round(0, {1: 0.5}, 1, 0.5, [1], True, 1), seconds=2.0)
    assert state.saved_rounds() == [
        {"index": 0, "scores": {1: 0.5}, "chosen": 1, "score": 0.5, "linear": [1], "passed": True, "evaluations": 1}
    ]
    saved = json.loads(path.read_text())
    assert saved["heldout"]["1,2"]["score"] == 0.2 and saved["search_evaluations"] == 1
    assert saved["timing"]["search"] == 2.0 and saved["rounds"][0]["seconds"] == 2.0
    assert SearchState(path, {"metric": "accuracy", "seed": 0}).data == saved
    with pytest.raises(ValueError, match=r"other settings \(seed\)"):
        SearchState(path, {"metric": "accuracy", "seed": 1})


def test_scores_on_another_number_of_items_are_dropped(tmp_path):
    state = SearchState(tmp_path / "search.json", {})
    state.scores_on("verify", 20)["scores"]["teacher"] = {"score": 0.5, "seconds": 1.0}
    assert state.scores_on("verify", 20)["scores"] == {"teacher": {"score": 0.5, "seconds": 1.0}}
    assert state.scores_on("verify", 30) == {"items": 30, "scores": {}}
