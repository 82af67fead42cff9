"""``lit-dof plan`` asks the objects the fit builds: a layer loss defined here, the planner's own allocation."""

from __future__ import annotations

from typing import ClassVar

import pytest

from lit_dof.pipeline.architecture import resolve_teacher_config
from lit_dof.pipeline.cli import parse_fit_config, plan_main
from lit_dof.pipeline.plan_report import plan_config
from lit_dof.pipeline.planner import StudentSpec
from lit_dof.students.layer_losses import LayerLoss, LayerStep, LossBytes, SoftmaxRowLoss
from lit_dof.teacher.sharded import empty_causal_lm
from tests.conftest import REPO, TINYSTORIES
from tests.pipeline.conftest import BASE

TINY = [
    "--config",
    str(BASE),
    "--model.init_args.planner=lit_dof.pipeline.planner.FixedPlanner",
    f"--model.init_args.teacher={TINYSTORIES}",
    "--data.init_args.seq_len=256",
    "--data.init_args.batch_size=2",
]
REPORT = REPO / "docs/results/sliding_window/records/dof_pooled.json"  # a DoF report of the quickstart teacher


class PaddedLoss(LayerLoss):
    """A loss lit-dof does not ship: the softmax rows, with ``extra`` bytes more kept for backward per layer."""

    extra: ClassVar[int] = 0

    def __call__(self, twin, captured, *, query_rows=None, generator=None):
        return SoftmaxRowLoss()(twin, captured, query_rows=query_rows, generator=generator)

    def step_bytes(self, step: LayerStep) -> LossBytes:
        base = super().step_bytes(step)
        return LossBytes(saved=base.saved + self.extra, transient=base.transient)


def _layerwise(args: list[str]) -> dict[str, int]:
    _, run, phases = plan_config(parse_fit_config(args))
    phase = next(p for p in phases if p.name == "layerwise")
    return {**phase.device, **phase.host}


def test_plan_accepts_a_loss_defined_here_and_counts_its_memory_term(capsys, monkeypatch):
    """The class path of a LayerLoss subclass of this module plans (its name printed); its own term enters the
    layer-wise phase exactly: ``extra`` bytes in the one-layer graph, L × ``extra`` with every layer's graph alive."""
    loss = [f"--model.init_args.loss={__name__}.PaddedLoss"]
    text = plan_main([*TINY, *loss])
    assert "PaddedLoss loss" in text and text.splitlines()[-1].startswith("plan peak_gpu_gib=")
    capsys.readouterr()
    base = _layerwise([*TINY, *loss])
    assert base == _layerwise([*TINY, "--model.init_args.loss=lit_dof.students.layer_losses.SoftmaxRowLoss"])
    monkeypatch.setattr(PaddedLoss, "extra", 12345)
    padded = _layerwise([*TINY, *loss])
    assert padded["loss graph (one layer)"] - base["loss graph (one layer)"] == 12345
    assert {k: v for k, v in padded.items() if k != "loss graph (one layer)"} == {
        k: v for k, v in base.items() if k != "loss graph (one layer)"
    }
    summed = [*TINY, *loss, "--model.init_args.layer_backward=false"]
    monkeypatch.setattr(PaddedLoss, "extra", 0)
    before = _layerwise(summed)["loss graphs (all layers)"]
    monkeypatch.setattr(PaddedLoss, "extra", 12345)
    assert _layerwise(summed)["loss graphs (all layers)"] - before == 2 * 12345  # TinyStories: 2 linear layers


@pytest.mark.parametrize(
    "planner",
    [
        ["--model.init_args.planner.init_args.strategy=dof"],  # the quickstart's min_dim 8
        ["--model.init_args.planner.init_args.strategy=dof_clip", "--model.init_args.planner.init_args.budget=32"],
        ["--model.init_args.planner.init_args.strategy=dof", "--model.init_args.planner.init_args.multiple_of=16"],
        ["--model.init_args.planner.init_args.strategy=fix"],
        ["--model.init_args.planner=lit_dof.pipeline.planner.FixedPlanner"],
    ],
)
def test_plan_feature_dims_are_the_fit_planners(planner):
    """The plan's dims are what the fit's planner returns for the same command line (a DoF report to allocate
    from), so both come from one allocation; the report's own allocation (head-size budget, no min_dim) is not it."""
    args = ["--config", str(BASE)]
    args += [f"--model.init_args.planner.init_args.report_path={REPORT}", *planner]
    config = parse_fit_config(args)
    _, run, _ = plan_config(config)
    model = config.model
    teacher = empty_causal_lm(resolve_teacher_config(model.teacher_name))
    spec = StudentSpec(model.teacher_name, model.share_kv_maps, model.sliding_window)
    fit = model.planner.plan(teacher, None, spec).feature_dims
    assert run.feature_dims == fit and len(fit) == 30
    if planner == ["--model.init_args.planner.init_args.strategy=dof"]:
        from lit_dof.dof import DoFReport

        assert fit != DoFReport.load(REPORT).feature_dims("dof")  # min_dim 8 lifts the smallest layers


def test_plan_counts_the_values_a_gated_far_memory_keeps():
    """Gated twins keep each layer's v in the capture (the gates read it): captured bytes grow by Hk/(Hq + Hk); with
    the output loss v is the loss's own, not counted twice."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(TINYSTORIES)
    Hq, Hk = config.num_attention_heads, config.num_key_value_heads
    window = ["--model.init_args.sliding_window.window=16", "--model.init_args.sliding_window.far_decay=64"]
    plain = _layerwise([*TINY, *window])["captured q/k"]
    gated = _layerwise([*TINY, *window, "--model.init_args.sliding_window.far_gate=true"])["captured q/k"]
    assert gated * (Hq + Hk) == plain * (Hq + 2 * Hk)
    output = ["--model.init_args.loss=lit_dof.students.layer_losses.OutputLoss"]
    with_output = [*TINY, *window, *output]
    assert _layerwise([*with_output, "--model.init_args.sliding_window.far_gate=true"]) == _layerwise(with_output)
