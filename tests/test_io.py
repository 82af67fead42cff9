"""Atomic writes: a failure leaves the previous content; a success replaces it completely."""

import json

import pytest

from lit_dof.io import atomic_directory, atomic_write_json


def test_atomic_directory_replaces_or_keeps(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("first")
    assert (target / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "first"
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_write_json(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})
    monkeypatch.setattr(json, "dumps", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        atomic_write_json(path, {"a": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
