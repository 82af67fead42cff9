"""scripts/paired_tasks.py: the paired task differences of an eval record against a comparison cell, checked
against the differences and standard errors computed by hand, and the records it refuses."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from lit_dof.comparison.collect import encode_items
from lit_dof.comparison.rows import PRIMARY_METRIC
from tests.conftest import load_script

MINE = {"piqa": [1, 1, 0, 1, 0, 1], "wsc273": [1, 0, 0, 1]}
THEIRS = {"piqa": [1, 0, 0, 1, 1, 0], "wsc273": [1, 1, 0, 1]}


def _eval_record(path, items):
    tasks = {task: {"n": len(values), "items": {PRIMARY_METRIC[task]: [float(v) for v in values], "other": []}}
             for task, values in items.items()}  # fmt: skip  # one comprehension
    path.write_text(json.dumps({"tasks": tasks, "provenance": {}}))
    return str(path)


def _report(path, cells):
    path.write_text(json.dumps({"cells": [{"row": row, "budget": budget,
                                           "items": {t: encode_items(v) for t, v in items.items()}}
                                          for row, budget, items in cells]}))  # fmt: skip  # nested literal
    return str(path)


def _by_hand(a, b):
    diffs = [x - y for x, y in zip(a, b)]
    return statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def test_differences_and_average_equal_the_paired_statistics_by_hand(tmp_path, capsys):
    script = load_script("paired_tasks")
    mine = _eval_record(tmp_path / "eval.json", MINE)
    report = _report(tmp_path / "comparison.json", [("teacher", 64, THEIRS), ("dof", 64, MINE)])
    result = script.main([mine, "--against", f"{report}:teacher", f"{report}:dof"])
    versus = result[f"{report}:teacher"]
    for task in MINE:
        mean, stderr = _by_hand(MINE[task], THEIRS[task])
        assert versus["tasks"][task]["difference"] == pytest.approx(mean)
        assert versus["tasks"][task]["stderr"] == pytest.approx(stderr)
    errors = [_by_hand(MINE[t], THEIRS[t]) for t in ("piqa", "wsc273")]
    assert versus["average"]["difference"] == pytest.approx(sum(m for m, _ in errors) / 2)
    assert versus["average"]["stderr"] == pytest.approx(math.sqrt(sum(s**2 for _, s in errors)) / 2)
    same = result[f"{report}:dof"]  # itself: zero difference, zero error
    assert same["average"] == {"difference": 0.0, "stderr": 0.0, "scores": same["average"]["scores"]}
    assert "average" in capsys.readouterr().out


def test_ambiguous_cells_and_different_examples_are_refused(tmp_path):
    script = load_script("paired_tasks")
    mine = _eval_record(tmp_path / "eval.json", MINE)
    report = _report(tmp_path / "comparison.json", [("teacher", 64, THEIRS), ("teacher", 32, THEIRS)])
    with pytest.raises(ValueError, match=r"2 cells match; write .*ROW@C, one of \['teacher@32', 'teacher@64'\]"):
        script.main([mine, "--against", f"{report}:teacher"])
    assert script.main([mine, "--against", f"{report}:teacher@32"])
    shorter = _eval_record(tmp_path / "short.json", {"piqa": MINE["piqa"][:5], "wsc273": MINE["wsc273"]})
    with pytest.raises(ValueError, match=r"different numbers of examples on \['piqa'\]"):
        script.main([shorter, "--against", f"{report}:teacher@64"])
