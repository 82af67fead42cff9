"""``search.json``: hybrid keys, resuming with the same settings only, memoised scores, score sets by size; the
typed record reads the committed record (an older format) and renders it into its committed report byte for
byte."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pydantic import ValidationError

from lit_dof.hybrid.record import Confirmation, Measured, RecordedRound, RecordedSettings, Scored, SearchRecord
from lit_dof.hybrid.report import markdown
from lit_dof.hybrid.search import Round
from lit_dof.hybrid.state import SearchState, hybrid_key
from lit_dof.teacher import DEFAULT_TEACHER
from tests.conftest import REPO

SETTINGS = RecordedSettings(
    bank="bank",
    task="arc_easy",
    metric="accuracy",
    corpus=None,
    search_items=4,
    heldout_items=8,
    tolerance=0.03,
    relative=False,
    shortlist=None,
    shortlist_k=4,
    max_linear=None,
    prefix_cache=True,
    seed=0,
)
COMMITTED = REPO / "docs/results/hybrid"


def test_hybrid_key():
    assert hybrid_key([3, 1, 10]) == "1,3,10" and hybrid_key(()) == "teacher"


def test_state_resumes_with_the_same_settings_and_refuses_others(tmp_path):
    path = tmp_path / "search.json"
    state = SearchState(path, SETTINGS)
    assert state.record == SearchRecord(SETTINGS) and not path.exists()
    calls = []
    score = state.memoised(state.record.heldout, lambda linear: calls.append(linear) or len(linear) / 10)
    assert score([2, 1]) == 0.2 and score((1, 2)) == 0.2 and calls == [frozenset({1, 2})]
    state.add_round(Round(0, {1: 0.5}, 1, 0.5, [1], True, 1), seconds=2.0)
    assert state.record.rounds == [RecordedRound(0, {1: 0.5}, 1, 0.5, [1], True, 1, seconds=2.0)]
    saved = json.loads(path.read_text())  # the file as other tools read it: plain JSON, integer keys as strings
    assert saved["heldout"]["1,2"]["score"] == 0.2 and saved["search_evaluations"] == 1
    assert saved["timing"]["search"] == 2.0 and saved["rounds"][0] == {
        "index": 0,
        "scores": {"1": 0.5},
        "chosen": 1,
        "score": 0.5,
        "linear": [1],
        "passed": True,
        "evaluations": 1,
        "seconds": 2.0,
    }
    resumed = SearchState(path, SETTINGS).record
    assert resumed == state.record and resumed.rounds[0].scores == {1: 0.5}  # keys back to layer indices
    with pytest.raises(ValueError, match=r"other settings \(tolerance, seed\)"):
        SearchState(path, replace(SETTINGS, tolerance=0.1, seed=1))


def test_scores_on_another_number_of_items_are_dropped(tmp_path):
    state = SearchState(tmp_path / "search.json", SETTINGS)
    state.scores_on("verify", 20).scores["teacher"] = Measured(0.5, 1.0)
    assert state.scores_on("verify", 20).scores == {"teacher": Measured(0.5, 1.0)}
    assert state.scores_on("verify", 30) == Scored(30) and state.record.verify == Scored(30)
    assert state.scores_on("confirm", 5) == Confirmation(5)


def test_a_record_from_disk_is_validated_and_builds_only_its_types(tmp_path):
    data = SearchRecord(SETTINGS).to_json()
    with pytest.raises(ValidationError, match="search_items"):
        SearchRecord.from_json({**data, "settings": {**data["settings"], "search_items": "many"}})
    with pytest.raises(ValidationError, match="tolerance"):
        SearchRecord.from_json({**data, "settings": {k: v for k, v in data["settings"].items() if k != "tolerance"}})
    hostile = {**data, "heldout": {"teacher": {"score": 1.0, "seconds": 0.0, "__class__": "os.system"}}}
    assert SearchRecord.from_json(hostile).heldout == {"teacher": Measured(1.0, 0.0)}  # extra keys are dropped


def test_the_far_term_retrieval_search_renders_into_its_committed_report_byte_for_byte():
    records = REPO / "docs/results/far_term/records"
    record = SearchRecord.load(records / "retrieval_layers_search.json")
    assert markdown(record) == (records / "retrieval_layers_hybrid.md").read_text()


def test_the_committed_record_renders_into_its_committed_report_byte_for_byte():
    record = SearchRecord.load(COMMITTED / "hybrid.json")
    assert record.teacher == DEFAULT_TEACHER  # written before the record named it: upgraded on load
    assert markdown(record) == (COMMITTED / "hybrid.md").read_text()
    assert SearchRecord.from_json(record.to_json()) == record
    assert record.exported.most_linear.linear == record.confirm.most_linear
    assert record.curves["greedy"] and all(isinstance(k, int) for k in record.curves["greedy"])


def test_the_report_names_the_teacher_the_bank_was_made_from():
    record = SearchRecord.load(COMMITTED / "hybrid.json")
    assert markdown(record).startswith("# Hybrid models: Distill-then-Replace on the embedded SmolLM2-135M-Instruct\n")
    other = replace(record, teacher="models/TinyStories-656K")
    assert markdown(other).startswith("# Hybrid models: Distill-then-Replace on `models/TinyStories-656K`\n")


def test_the_report_names_every_ordering_tied_for_the_best_mean_and_bounds_one_scores_error():
    record = SearchRecord.load(COMMITTED / "hybrid.json")
    tied = replace(record, curves={**record.curves, "greedy": dict(record.curves["uniform"])})
    text = markdown(tied)
    assert "Best mean over the counts: **greedy search, uniform interleaving** (tied)." in text
    n = record.settings.heldout_items
    assert f"at most {0.5 / n**0.5:.4f} (p = 0.5)" in text  # the widest binomial SE, whatever the teacher scored
    assert "Best mean over the counts: **uniform interleaving**." in markdown(record)  # no tie: one name
