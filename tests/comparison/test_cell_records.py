"""A cell's stage records as the report reads them: evaluation records of every format written (retrieval scored
as ``acc`` before ``exact_match``; a device recorded only as "no CUDA"), fit attempts and control records written
and read back."""

from __future__ import annotations

import json
from dataclasses import replace

from lit_dof.comparison.artefacts import read_cell, retrieval_summary, task_score
from lit_dof.comparison.cell_records import (
    ControlRecord,
    EvalRecord,
    FitAttempt,
    FitSummary,
    load_attempts,
    save_attempts,
)
from lit_dof.evaluation.control_record import Control
from lit_dof.records import load_record, parse_record


def test_an_evaluation_record_gives_the_primary_metric_its_items_and_device(tmp_path):
    entry = {
        "acc": 0.5,
        "acc_stderr": 0.25,
        "acc_norm": 0.75,
        "n": 4,
        "beyond_exact": 0.5,
        "items": {"acc_norm": [1, 1, 0, 1]},
        "provenance": {"cuda": False},
    }
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "piqa.json").write_text(json.dumps(entry))
    record = EvalRecord.load(tmp_path / "eval" / "piqa.json")
    score = task_score(record, "acc_norm")
    assert (score.value, score.stderr, score.n, score.beyond_exact) == (0.75, None, 4, 0.5)
    assert record.provenance.where == "cpu"  # before devices were recorded: the comparison ran on the CPU
    found = read_cell(tmp_path, ["piqa", "arc_easy"])
    assert found.items == {"piqa": [1.0, 1.0, 0.0, 1.0]} and found.devices == {"cpu"} and list(found.scores) == ["piqa"]
    assert found.measured and not read_cell(tmp_path / "nothing", ["piqa"]).measured


def test_retrieval_records_of_both_formats(tmp_path):
    cells = {"1024": {"0.5": {"n": 2, "mean": 0.5, "se": 0.5}}}
    examples = [{"beyond_window": True}, {"beyond_window": False}]
    for name, metric in (("new", "exact_match"), ("old", "acc")):
        record = {
            metric: 0.5,
            f"{metric}_stderr": 0.5,
            "n": 2,
            "items": {metric: [1, 0]},
            "cells": cells,
            "examples": examples,
            "provenance": {"device": "cpu", "seconds": 3.0},
        }
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
        summary = retrieval_summary(EvalRecord.load(tmp_path / f"{name}.json"))
        assert (summary.exact_match, summary.items, summary.beyond_window, summary.device) == (0.5, [1, 0], 0.5, "cpu")
        assert summary.by_context(1024) == 0.5 and summary.by_context(2048) is None


def test_attempts_and_control_records_round_trip(tmp_path):
    attempts = [FitAttempt(12.5, None, False), FitAttempt(3.0, 0, True, exported=False)]
    save_attempts(tmp_path / "fit_attempts.json", attempts)
    assert load_attempts(tmp_path / "fit_attempts.json") == attempts and load_attempts(tmp_path / "none.json") == []
    control = Control("equal_state", "the teacher behind W' + s", 129, 4, "teacher", 512, 6_000_000, 6_150_960)
    record = ControlRecord(control, None, "../../../controls/teacher_window129_sinks4")
    (tmp_path / "control.json").write_text(json.dumps(record.to_json()))
    assert ControlRecord.load(tmp_path / "control.json") == record
    assert parse_record(ControlRecord, {"control": None, "why": "no window"}) == ControlRecord(None, "no window")


def test_a_fit_record_holds_per_layer_per_head_and_exact_dims_together(tmp_path):
    """A student with exact KV heads (M = 0) in some layers has an int for the others: one list of both kinds."""
    dims = [8, [0, 16], [12, 12], 4]
    (tmp_path / "fit.json").write_text(json.dumps({"student": "s", "feature_dims": dims, "total_features": 28.0}))
    summary = load_record(FitSummary, tmp_path / "fit.json")
    assert summary.feature_dims == dims and summary.total_features == 28.0


def test_rows_are_data_and_a_bad_rows_file_is_refused_by_name(tmp_path):

    import pytest

    from lit_dof.comparison.cells import Comparison
    from lit_dof.comparison.rows import ROWS, ROWS_FILE, Row, load_rows

    assert list(load_rows(ROWS_FILE)) == list(ROWS) and ROWS["teacher"].kind == "teacher"
    assert ROWS["dof_l2"] == Row(
        "dof_l2", ("methods/dof.yaml", "methods/l2.yaml"), note="L2 kernel loss", reference="fix_l2"
    )
    assert all(ROWS[r.reference] for r in ROWS.values() if r.kind == "student")  # every reference is a row
    mine = tmp_path / "rows.yaml"
    mine.write_text(
        "rows:\n  - {name: teacher, kind: teacher}\n  - {name: fix, configs: [methods/fix.yaml]}\n"
        "  - {name: mine, configs: [methods/dof.yaml]}\n"
    )
    runner = Comparison(out=tmp_path, rows_file=mine)
    assert list(runner.known_rows) == ["teacher", "fix", "mine"] and runner.known_rows["mine"].reference == "fix"
    for text, message in [
        ("rows:\n  - {name: a, confgs: [methods/dof.yaml]}\n", "confgs"),  # a typo is an error, not a default
        ("rows:\n  - {name: a, reference: a}\n  - {name: a, reference: a}\n", "'a' twice"),
        ("rows:\n  - {name: a, reference: nowhere}\n", "reference 'nowhere' is not a row"),
        ("rows:\n  - {name: a, kind: control, reference: a}\n", "kind 'control'"),
        ("rows:\n  - {name: a, reference: a}\ngap_floor: b\n", "gap_floor 'b' is not a row"),
    ]:
        mine.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_rows(mine)
    mine.write_text("rows:\n  - {name: a, configs: [methods/nothing.yaml], reference: a}\n")
    with pytest.raises(FileNotFoundError, match="methods/nothing.yaml"):
        replace(runner, rows_file=mine)


def test_the_gap_floor_is_the_rows_files_and_the_footnote_names_it():
    from lit_dof.comparison.records import Report
    from lit_dof.comparison.render import markdown

    cells = [{"row": "teacher", "kind": "teacher", "budget": 64}, {"row": "fix", "kind": "student", "budget": 64}]
    legacy = Report.from_json({"cells": cells})  # written before reports named their floor: Performer's
    assert legacy.gap_floor == "performer" and "gap closed = (avg − Performer avg)" in markdown(legacy)
    assert "gap closed = (avg − `fix` avg) / (teacher avg − `fix` avg)" in markdown(replace(legacy, gap_floor="fix"))
    assert "gap closed =" not in markdown(replace(legacy, gap_floor=None))
