"""Distributed training on CPU: DDP and sharded (FSDP2 via ModelParallelStrategy) with 2 processes (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_dof.students import load_student
from tests.conftest import REPO
from tests.pipeline.conftest import fit_args

STRATEGIES = {
    "ddp": ["--trainer.strategy=ddp"],
    "fsdp2": ["--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
              "--trainer.strategy.data_parallel_size=2", "--trainer.strategy.tensor_parallel_size=1"],
}  # fmt: skip
STRATEGIES["fsdp2_bf16_true"] = [*STRATEGIES["fsdp2"], "--trainer.precision=bf16-true"]  # configs/trainer/fsdp.yaml's


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_two_process_training(tmp_path, strategy):
    # cwd = tmp_path: the config's relative checkpoint directory lands there too
    args = fit_args(tmp_path, steps=3, extra=["--trainer.devices=2", "--trainer.accelerator=cpu", *STRATEGIES[strategy]])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "lit_dof.pipeline.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    students = list(Path(tmp_path).rglob("student/model.safetensors"))
    assert len(students) == 1, "rank 0 exports exactly one student"
    student = load_student(students[0].parent)
    assert student.feature_dims and all(m >= 8 for m in student.feature_dims)
    assert student.dtype == (torch.bfloat16 if strategy.endswith("bf16_true") else torch.float32)  # the teacher's
    assert all(p.dtype == torch.float32 for n, p in student.named_parameters() if ".feature_map." in n)
    ids = torch.randint(3, 2000, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(student(ids).logits).all()
    assert "max_steps=3` reached" in done.stdout + done.stderr
