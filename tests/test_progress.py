"""Progress lines (lit-dof compare, lit-dof hybrid): items done of the total, elapsed time, an estimate of the rest."""

from __future__ import annotations

import io

import pytest

from lit_dof.progress import Progress, clock_text


def test_eta_is_the_mean_of_the_items_that_did_work_times_the_items_left():
    now = [0.0]
    out = io.StringIO()
    progress = Progress("compare", 4, "cell", stream=out, clock=lambda: now[0])
    progress.begin("C=64 teacher")
    now[0] = 0.2  # finished before: skipped in no time
    progress.begin("C=64 fix")
    now[0] = 100.2
    progress.begin("C=64 dof")
    assert progress.done == 2 and progress.eta() == pytest.approx(100.0 * 2)
    now[0] = 400.2
    progress.end("last but one")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[compare] cell 1/4 C=64 teacher · elapsed 0:00:00 · ETA –"
    assert lines[2] == "[compare] cell 3/4 C=64 dof · elapsed 0:01:40 · ETA ≈ 0:03:20"
    assert lines[3] == "[compare] cell 3/4 done: last but one · elapsed 0:06:40 · ETA ≈ 0:03:20"  # 200 s × 1 left
    assert clock_text(3 * 3600 + 61.9) == "3:01:01"


def test_rounds_without_begin_are_timed_from_the_previous_end(capsys):
    now = [10.0]
    progress = Progress("hybrid", 3, "round", clock=lambda: now[0])
    progress.done = 1  # one round recorded by an earlier run
    now[0] = 40.0
    progress.end("layer 2 linear")
    assert progress.worked == [30.0] and progress.eta() == pytest.approx(30.0)
    assert capsys.readouterr().err == "[hybrid] round 2/3 done: layer 2 linear · elapsed 0:00:30 · ETA ≈ 0:00:30\n"
    with pytest.raises(ValueError):
        Progress("x", -1, "item")
