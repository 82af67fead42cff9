"""The quickstart's recipe on the real SmolLM2 teacher and the local Wikipedia corpus, at the budget of the one-minute
start (``configs/smoke.yaml`` over ``configs/quickstart.yaml``, as ``scripts/quickstart.sh --smoke`` runs it), and the
script's own summary of where the run went and what to do next."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.data.sources import split_documents
from lit_dof.hybrid.recall_items import document_recall_items
from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.exact_heads import head_scores, top_heads
from lit_dof.students import load_student
from lit_dof.students.surgery import exact_heads
from lit_dof.teacher.loading import load_teacher
from tests.conftest import REPO, WIKIPEDIA


@pytest.mark.slow
def test_smoke_config_runs_the_quickstart_recipe_on_smollm2(tmp_path, smollm2_dir, monkeypatch):
    monkeypatch.setenv("LIT_DOF_CORPUS", str(WIKIPEDIA))  # the offline path of scripts/quickstart.sh
    monkeypatch.chdir(tmp_path)
    cli = build_cli(
        [
            "fit",
            "--config",
            str(REPO / "configs/quickstart.yaml"),
            "--config",
            str(REPO / "configs/smoke.yaml"),
            "--trainer.enable_progress_bar=false",
            f"--model.init_args.teacher={smollm2_dir}",
        ]
    )
    log_dir = Path(cli.trainer.log_dir)
    assert log_dir.resolve() == (tmp_path / "runs" / "smoke" / "version_0").resolve()  # not the main job's runs
    report = json.loads((log_dir / "dof.json").read_text())
    assert report["num_samples"] == 128 and report["tokens"] == 2 * 128  # the smoke's estimate: 1 batch, J = 128
    assert len(report["head_dof"]) == 30 and all(len(h) == 9 for h in report["head_dof"])
    assert abs(sum(report["allocations"]["dof"]) - 30 * 64) <= 15 and report["warnings"] == []
    assert max(report["allocations"]["dof"]) - min(report["allocations"]["dof"]) >= 48
    student = load_student(log_dir / "student")
    layers = student.linear_modules()  # the quickstart's recipe, untouched by the smoke's budgets: window 64 + 4
    # sinks + a linear far term, decaying (τ = 128 tokens) and on un-rotated q/k, as saved and loaded back, in every
    # KV head but the 18 exact ones (a layer with exact heads groups its heads: HeadGroupedAttention)
    twins = [g for t in layers.values() for g in (t.twins if isinstance(t, HeadGroupedAttention) else [t])]
    assert {
        (type(t).__name__, t.window, t.sink_tokens, t.far_term, t.sliding_window.far_decay, t.needs_rotary)
        for t in twins
    } == {("SlidingWindowLinearAttention", 64, 4, True, 128, True)}
    probe = cli.model.exact_heads  # the quickstart's RetrievalHeads at the smoke's size: 2 items of 256 tokens
    teacher, tokenizer = load_teacher(str(smollm2_dir))
    items = document_recall_items(split_documents(str(WIKIPEDIA), "validation"), tokenizer, 256, 2, skip=32)
    exact = top_heads(head_scores(teacher, items), 18)  # 20% of SmolLM2's 90 KV heads
    assert (probe.items, probe.block, probe.share) == (2, 256, 0.2) and exact_heads(student.model) == exact
    dims = [max(8, m) for m in report["allocations"]["dof"]]
    expected = [[0 if h in exact[i] else m for h in range(3)] if i in exact else m for i, m in enumerate(dims)]
    assert student.feature_dims == expected
    lora = cli.model.lora  # the LoRA tail (rank 8 on q/k/v/o), trained in the last 2 of 16 steps and merged
    assert (lora.rank, lora.alpha, lora.target_modules) == (8, 16.0, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert cli.trainer.global_step == 16 and "train/logit_kd" in cli.trainer.callback_metrics  # the tail ran
    name = "layers.0.self_attn.q_proj.weight"
    with safe_open(log_dir / "student" / "model.safetensors", "pt") as saved:  # merged: no adapter entries
        keys, merged = list(saved.keys()), saved.get_tensor(f"model.model.{name}")
    with safe_open(smollm2_dir / "model.safetensors", "pt") as original:
        teacher_q = original.get_tensor(f"model.{name}")
    assert not [k for k in keys if "lora_" in k] and not torch.equal(merged, teacher_q)  # the trained update
    assert 10 < float(cli.trainer.callback_metrics["val/ppl_teacher"]) < 100
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()  # the run's own, not one every quickstart shares


@pytest.mark.parametrize("smoke", [True, False], ids=["smoke", "main"])
def test_script_runs_the_configs_and_prints_where_the_student_went(tmp_path, smoke):
    """``scripts/quickstart.sh`` in a copy of the checkout whose ``lit-dof`` records its arguments and makes a run."""
    for name in ("scripts", "configs"):
        shutil.copytree(REPO / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "lit-dof").write_text(
        '#!/usr/bin/env bash\necho "$OMP_NUM_THREADS $*" > args.txt\nmkdir -p runs/$NAME/version_3/student\n'
        "touch runs/$NAME/version_3/student/config.json\n"
    )
    (bin_dir / "lit-dof").chmod(0o755)
    env = {**os.environ, "LIT_DOF_SKIP_SETUP": "1", "NAME": "smoke" if smoke else "quickstart"}
    env.pop("OMP_NUM_THREADS", None)
    args = ["--smoke"] if smoke else []
    result = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "quickstart.sh"), *args, "--trainer.max_steps", "3"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    configs = "fit --config configs/quickstart.yaml" + (" --config configs/smoke.yaml" if smoke else "")
    threads = "1" if smoke else ""  # the smoke runs on one thread unless told otherwise
    assert (tmp_path / "args.txt").read_text() == f"{threads} {configs} --trainer.max_steps 3\n"
    run = f"runs/{env['NAME']}/version_3"
    assert f"run directory: {run}" in result.stdout and f"student:       {run}/student" in result.stdout
    for command in (
        f"lit-dof generate --model {run}/student",
        f"lit-dof chat {run}/student",
        f"lit-dof eval --model {run}/student",
        f"tensorboard --logdir runs/{env['NAME']}",
    ):
        assert command in result.stdout, result.stdout
