"""tools/state_retrieval_plot.py: a recorded growth per token carries a row's state to the asked context (a hybrid's
exact layers); without one a full-attention row's KV cache is scaled (linear in tokens), a windowed row's state
kept; seeds are averaged, rows without retrieval or state are left out; the figure is written."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


def _cell(row, kind, nbytes, passkey, seed=0, window=64, recall=None):
    retrieval = {"passkey": {"exact_match": passkey}}
    if recall is not None:
        retrieval["recall"] = {"exact_match": recall}
    control = None if kind != "control" else {"window": window}
    return {
        "row": row,
        "kind": kind,
        "seed": seed,
        "state": {"context": 512, "bytes": nbytes},
        "control": control,
        "retrieval": retrieval,
    }


def test_points_scale_full_attention_and_average_seeds(tmp_path):
    tool = load_script("state_retrieval_plot", "tools")
    report = {
        "cells": [
            _cell("teacher", "teacher", 1000, 0.75, seed=None, recall=0.9),
            _cell("s", "student", 300, 0.0),
            _cell("s", "student", 310, 0.5, seed=1, recall=0.25),
            _cell("s:tail_only", "control", 1000, 0.7, window=None),
            _cell("s:equal_state", "control", 299, 0.1),
            {**_cell("hybrid", "student", 300, 0.5), "state": {"context": 512, "bytes": 300, "growth": 2}},
            {"row": "x", "kind": "student", "seed": 0, "state": None, "control": None, "retrieval": {"passkey": {}}},
        ]
    }
    found = tool.points([report], 4096)
    assert found["passkey"]["teacher"] == (8000.0, 0.75, 1) and found["passkey"]["s:tail_only"] == (8000.0, 0.7, 1)
    assert found["passkey"]["s"] == (305.0, 0.25, 2) and found["passkey"]["s:equal_state"] == (299, 0.1, 1)
    assert "x" not in found["passkey"] and found["recall"] == {"teacher": (8000.0, 0.9, 1), "s": (310, 0.25, 1)}
    assert found["passkey"]["hybrid"] == (300 + 2 * (4096 - 512), 0.5, 1)  # its softmax layers' KV caches grow
    with pytest.raises(SystemExit, match="below the recorded context 512"):
        tool.points([report], 256)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    tool.main([str(path), "--out", str(tmp_path / "fig.png")])
    assert (tmp_path / "fig.png").stat().st_size > 0
    path.write_text(json.dumps({"cells": [report["cells"][-1]]}))
    with pytest.raises(SystemExit, match="no cell of these reports has a retrieval record"):
        tool.main([str(path), "--out", str(tmp_path / "none.png")])
