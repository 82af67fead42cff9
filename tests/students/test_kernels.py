"""Kernel choice (``model.init_args.kernels``, ``Kernels.apply``): every sliding-window layer, per-head groups
included, runs the named kernels, and the student's outputs do not depend on them (fla through its own PyTorch
reference on the CPU); a fit built with them exports a student whose weights and config are kernel-free."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.pipeline.cli import build_cli
from lit_dof.students import linearize, load_student
from lit_dof.students.kernels import Kernels
from tests.conftest import tiny_model
from tests.pipeline.conftest import fit_args


def _layers(model):
    return [m for m in model.modules() if isinstance(m, SlidingWindowLinearAttention)]


@torch.no_grad()
def test_apply_sets_every_layer_and_outputs_do_not_change():
    pytest.importorskip("fla.ops.simple_gla.naive", reason="flash-linear-attention (pip install 'lit-dof[gpu]')")
    options = SlidingWindow(window=4, sink_tokens=1, far_decay=12.0)
    student = linearize(tiny_model("llama"), LearnedPRF, [[4, 8], 6, 8], sliding_window=options).eval()
    ids = torch.randint(3, 97, (1, 30), generator=torch.Generator().manual_seed(0))
    before = student(ids).logits
    assert Kernels(linear="fla").apply(student) == len(_layers(student)) == 4  # layer 0's two groups, then 1 and 2
    assert {(m.window_kernel, m.linear_kernel) for m in _layers(student)} == {("torch", "fla")}
    torch.testing.assert_close(student(ids).logits, before, rtol=1e-4, atol=1e-4)


def test_unknown_kernels_are_named():
    with pytest.raises(ValueError, match="kernels.window must be one of"):
        Kernels(window="triton")
    with pytest.raises(ValueError, match="kernels.linear must be one of"):
        Kernels(linear="cuda")


def test_a_fit_runs_with_the_kernels_of_its_config(tmp_path):
    pytest.importorskip("fla.ops.simple_gla.naive", reason="flash-linear-attention (pip install 'lit-dof[gpu]')")
    extra = ["--model.init_args.sliding_window.window=16", "--model.init_args.kernels.linear=fla"]
    cli = build_cli(fit_args(tmp_path, "methods/swa_sink_linear.yaml", steps=2, extra=extra))
    assert cli.model.kernels == Kernels(linear="fla")
    assert {m.linear_kernel for m in _layers(cli.model.student)} == {"fla"}
    exported = load_student(Path(cli.trainer.log_dir) / "student")
    assert {m.linear_kernel for m in _layers(exported)} == {"torch"}  # a runtime choice, not saved
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])
