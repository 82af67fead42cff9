"""The committed results are a durable record: every ``comparison.json`` under docs/results renders, with
today's code, into exactly the committed ``comparison.md`` beside it (byte for byte)."""

from __future__ import annotations

import json

import pytest

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
    rendered = markdown(json.loads(path.read_text()), header) + "\n"
    assert rendered == committed, f"re-render {path.parent} with `lit-dof compare --stages '[]'` or fix the renderer"
