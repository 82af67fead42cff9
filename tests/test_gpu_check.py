"""scripts/gpu_check.sh --dry-run: every step of the prepared GPU check runs on the CPU with tiny shapes, and the
measurements it reports agree with the runs they come from."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import DATA, REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _run(*args, **env):
    environ = {**os.environ, "PYTHON": sys.executable, "LIT_DOF_DATA": str(DATA), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_reports_consistent_measurements(tmp_path):
    done = _run("--dry-run", "--out", str(tmp_path))
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stderr
    for name in ("env", "tests", "bench", "quickstart", "llama-3-8b"):
        assert f"step {name} rc=0" in summary
    assert "dry_run=1" in (tmp_path / "env.txt").read_text()
    collected = re.search(r"(\d+) tests? collected", (tmp_path / "tests.log").read_text())
    assert collected and int(collected[1]) >= 20  # the CUDA tests, collected only
    bench = (tmp_path / "bench.log").read_text()
    for layout in ("H=9 Hk=3 d=64", "H=32 Hk=8 d=128"):
        # the sliding layer (fp32); SmolLM2's shape also: the linear layer and the gated delta-rule memory (bf16)
        assert bench.count(layout) == 1 + 2 * (layout == "H=9 Hk=3 d=64")
    assert bench.count("fwd      T=   128") == 4 and "layer=sliding window=64 sinks=4" in bench
    assert "far_gate=True far_memory=delta" in bench
    for name, steps, rows, seq in (("quickstart", 8, 2, 128), ("llama-3-8b", 3, 1, 64)):
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert record["steps"] == steps and record["device"] == "cpu"
        # ThroughputMonitor points from step 1: every later step read rows × seq tokens
        assert record["timed_steps"] == steps - 1
        expected = rows * seq * record["timed_steps"] / record["timed_seconds"]
        assert record["tokens_per_sec"] == pytest.approx(expected, rel=1e-6)
        assert 0.05 < record["peak_gib"] < 20 and record["plan_gib"] > 0
        assert record["peak/plan"] == pytest.approx(record["peak_gib"] / record["plan_gib"])
        assert f"fit_check name={name} " in summary
    assert summary.rstrip().endswith("gpu_check failed_steps=0")


def test_bad_arguments_are_refused_before_any_step(tmp_path):
    done = _run("--frobnicate", "--out", str(tmp_path))
    assert done.returncode == 2 and "unknown argument --frobnicate" in done.stderr
    done = _run("--dry-run", "--out", str(tmp_path), LIT_DOF_DATA=str(tmp_path), LIT_DOF_CORPUS="")
    assert done.returncode == 2 and "no corpus" in done.stderr
    assert not (tmp_path / "summary.txt").exists()
