"""The quickstart configuration itself, on the real SmolLM2 teacher and the local Wikipedia corpus (tiny budget)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from lit_dof.pipeline.cli import build_cli
from lit_dof.students import load_student
from tests.conftest import REPO, WIKIPEDIA


@pytest.mark.slow
def test_quickstart_config_runs_on_smollm2(tmp_path, smollm2_dir, monkeypatch):
    monkeypatch.setenv("LIT_DOF_CORPUS", str(WIKIPEDIA))  # the offline path of scripts/quickstart.sh
    monkeypatch.chdir(tmp_path)
    planner = "--model.init_args.planner.init_args"
    cli = build_cli(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--trainer.max_steps=2",
                     "--trainer.val_check_interval=2", "--data.init_args.val_blocks=2", f"{planner}.num_batches=2",
                     f"{planner}.num_samples=256", "--trainer.enable_progress_bar=false",
                     f"--model.init_args.teacher={smollm2_dir}"])  # fmt: skip  # packed args
    log_dir = Path(cli.trainer.log_dir)
    report = json.loads((log_dir / "dof.json").read_text())
    assert len(report["head_dof"]) == 30 and all(len(h) == 9 for h in report["head_dof"])
    assert abs(sum(report["allocations"]["dof"]) - 30 * 64) <= 15 and report["warnings"] == []
    assert max(report["allocations"]["dof"]) - min(report["allocations"]["dof"]) >= 48
    student = load_student(log_dir / "student")
    twins = student.linear_modules().values()  # the shipped recipe: window 64 + 4 sinks + a linear far term,
    # decaying (τ = 128 tokens) and on un-rotated q/k, as saved and loaded back
    assert {(type(t).__name__, t.window, t.sink_tokens, t.far_term, t.sliding_window.far_decay, t.needs_rotary)
            for t in twins} == {("SlidingWindowLinearAttention", 64, 4, True, 128, True)}  # fmt: skip
    assert student.feature_dims == [max(8, m) for m in report["allocations"]["dof"]]
    lora = cli.model.lora  # the LoRA tail (rank 8 on q/k/v/o), merged away in the exported student
    assert (lora.rank, lora.alpha, lora.target_modules) == (8, 16.0, ["q_proj", "k_proj", "v_proj", "o_proj"])
    with safe_open(log_dir / "student" / "model.safetensors", "pt") as saved:  # merged: no adapter entries
        keys = list(saved.keys())
    assert "model.model.layers.0.self_attn.q_proj.weight" in keys and not [k for k in keys if "lora_" in k]
    assert cli.trainer.global_step == 2
    assert 10 < float(cli.trainer.callback_metrics["val/ppl_teacher"]) < 100
    assert log_dir.resolve() == (tmp_path / "runs" / "quickstart" / "version_0").resolve()
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()  # the run's own, not one every quickstart shares
