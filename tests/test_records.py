"""Typed JSON records (lit_dof.records): validated on the way in, nothing but the declared types built, written
back with integer keys as strings and read back equal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from lit_dof.records import dump_record, load_record, parse_record, save_record


@dataclass
class Point:
    step: int
    value: float


@dataclass
class Curve:
    name: str
    points: list[Point] = field(default_factory=list)
    by_step: dict[int, float] = field(default_factory=dict)


def test_a_record_round_trips_through_a_file(tmp_path):
    curve = Curve("val", [Point(1, 2.5), Point(3, 1.25)], {1: 2.5})
    save_record(tmp_path / "c.json", curve)
    stored = json.loads((tmp_path / "c.json").read_text())
    assert stored == {
        "name": "val",
        "points": [{"step": 1, "value": 2.5}, {"step": 3, "value": 1.25}],
        "by_step": {"1": 2.5},
    }
    assert load_record(Curve, tmp_path / "c.json") == curve and load_record(Curve, tmp_path / "none.json") is None
    assert dump_record([Point(0, 1.0)], list[Point]) == [{"step": 0, "value": 1.0}]


def test_bad_input_is_refused_by_field_and_extra_keys_build_nothing(tmp_path):
    with pytest.raises(ValidationError, match=r"points\.0\.step"):
        parse_record(Curve, {"name": "val", "points": [{"step": "first", "value": 1.0}]})
    with pytest.raises(ValidationError, match="name"):
        parse_record(Curve, {"points": []})
    hostile = {"name": "x", "__class__": "os.system", "points": [{"step": 1, "value": 1.0, "py/object": "os.system"}]}
    assert parse_record(Curve, hostile) == Curve("x", [Point(1, 1.0)])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError):
        load_record(Curve, tmp_path / "bad.json")
