"""The committed results are a durable record: every ``comparison.json`` under docs/results, whatever format it was
written in, loads as a typed report and renders, with today's code, into exactly the committed ``comparison.md``
beside it (byte for byte); writing it back loses nothing."""

from __future__ import annotations

import json

import pytest

from lit_dof.comparison.records import Report
from lit_dof.comparison.render import markdown
from tests.conftest import REPO

REPORTS = sorted((REPO / "docs" / "results").rglob("comparison.json"))


def test_there_are_committed_reports():
    assert len(REPORTS) >= 5, REPORTS


@pytest.mark.parametrize("path", REPORTS, ids=[str(p.parent.relative_to(REPO)) for p in REPORTS])
def test_a_committed_report_renders_into_its_committed_markdown(path):
    committed = (path.parent / "comparison.md").read_text()
    first = committed.split("\n", 1)[0]
    header = "" if first.startswith("|") else first  # write_report's optional first line is not in the JSON
    report = Report.load(path)
    rendered = markdown(report, header) + "\n"
    assert rendered == committed, f"re-render {path.parent} with `lit-dof compare --stages '[]'` or fix the renderer"
    assert Report.from_json(json.loads(json.dumps(report.to_json()))) == report
