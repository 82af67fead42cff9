"""Fits with the far memories of issue #45: a gated one (``sliding_window.far_gate``: the layer-wise capture keeps
the values the gates read, both phases train the gates) and a delta-rule one (``far_memory: delta``, trained with the
output loss), each exported with what it learned."""

from __future__ import annotations

from pathlib import Path

import torch

from lit_dof.pipeline.cli import build_cli
from lit_dof.students import load_student
from tests.pipeline.conftest import fit_args


def test_gated_far_term_fits_trains_its_gates_and_exports(tmp_path):
    extra = [
        "--model.init_args.sliding_window.window=16",
        "--model.init_args.sliding_window.far_gate=true",
        "--model.init_args.sliding_window.gate_min_decay=8",
    ]
    cli = build_cli(fit_args(tmp_path, "methods/swa_sink_linear_decay.yaml", steps=3, extra=extra))
    student = load_student(Path(cli.trainer.log_dir) / "student")
    assert student.config.window_options["far_gate"] and student.config.window_options["gate_min_decay"] == 8
    twins = student.linear_modules().values()
    assert all(t.far_gated and t.decay_rates() is None for t in twins)
    assert all(t.far_gate_weight.abs().sum() > 0 for t in twins)  # trained from w = 0
    start = torch.logit(torch.tensor(8 / 128))  # the bias starts at the rate 1/far_decay
    assert any((t.far_gate_bias - start).abs().max() > 0 for t in twins)
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])


def test_delta_rule_far_memory_fits_with_the_output_loss_and_exports(tmp_path):
    extra = [
        "--model.init_args.sliding_window.window=16",
        "--model.init_args.sliding_window.far_memory=delta",
        "--model.init_args.loss=lit_dof.students.layer_losses.OutputLoss",
    ]
    cli = build_cli(fit_args(tmp_path, "methods/swa_sink_linear_decay.yaml", steps=3, extra=extra))
    student = load_student(Path(cli.trainer.log_dir) / "student")
    assert student.config.window_options["far_memory"] == "delta"
    twins = student.linear_modules().values()
    assert all(t.far_delta and t.far_write_weight.abs().sum() > 0 for t in twins)  # trained from u = 0
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])
