"""Optimizer groups come from the feature maps (``FeatureMap.param_groups``), not from parameter names."""

from __future__ import annotations

import functools

import pytest
import torch

from lit_dof.attention import DiJiangFeatureMap, HedgehogFeatureMap, LearnedPRF, PerformerFeatureMap, SlidingWindow
from lit_dof.attention.feature_maps.base import PARAM_GROUPS
from lit_dof.pipeline.layerwise import LayerwiseDistillation
from lit_dof.pipeline.planner import FixedPlanner
from tests.conftest import save_tokenizer, tiny_model


class ProjectedHedgehog(HedgehogFeatureMap):
    """A third-party map whose projection should train at ``lr_z``."""

    def param_groups(self):
        return {"z": [self.weight]}


class MisnamedGroups(HedgehogFeatureMap):
    def param_groups(self):
        return {"projection": [self.weight]}


def _groups(tmp_path, feature_map, **kwargs) -> tuple[LayerwiseDistillation, dict[str, dict]]:
    tiny_model("llama").save_pretrained(tmp_path / "teacher")
    save_tokenizer(tmp_path / "teacher")
    module = LayerwiseDistillation(
        teacher=str(tmp_path / "teacher"), feature_map=feature_map, planner=FixedPlanner(8), seed=0,
        lr_z=0.02, lr_alpha=0.2, lr=0.005, **kwargs,
    )  # fmt: skip  # packed args
    module.configure_model()
    return module, {g["name"]: g for g in module.optimizer_groups()}


@pytest.mark.parametrize("cls", [LearnedPRF, PerformerFeatureMap, HedgehogFeatureMap, DiJiangFeatureMap])
def test_every_map_puts_each_parameter_in_exactly_one_known_group(cls):
    fmap = cls(16, 2, 8)
    groups = fmap.param_groups()
    assert set(groups) <= set(PARAM_GROUPS)
    members = [id(p) for ps in groups.values() for p in ps]
    assert sorted(members) == sorted(id(p) for p in fmap.parameters())  # all of them, once


def test_learned_prf_groups_and_the_window_weight(tmp_path):
    module, groups = _groups(tmp_path, LearnedPRF, sliding_window=SlidingWindow(window=4, sink_tokens=1))
    twins = list(module.student.linear_modules().values())
    assert {id(p) for p in groups["z"]["params"]} == {id(t.feature_map.z) for t in twins}
    assert {id(p) for p in groups["log_alpha"]["params"]} == {id(t.feature_map.log_alpha) for t in twins}
    assert {id(p) for p in groups["other"]["params"]} == {id(t.log_mix) for t in twins}  # β of the far term
    assert (groups["z"]["lr"], groups["log_alpha"]["lr"], groups["other"]["lr"]) == (0.02, 0.2, 0.005)


def test_a_map_declares_its_own_groups_and_unknown_ones_are_refused(tmp_path):
    module, groups = _groups(tmp_path, ProjectedHedgehog)
    twins = list(module.student.linear_modules().values())
    assert set(groups) == {"z"} and groups["z"]["lr"] == 0.02
    assert {id(p) for p in groups["z"]["params"]} == {id(t.feature_map.weight) for t in twins}
    module, _ = _groups(tmp_path / "plain", HedgehogFeatureMap)
    assert {g["name"] for g in module.optimizer_groups()} == {"other"}  # the default: lr
    with pytest.raises(ValueError, match="MisnamedGroups.param_groups\\(\\) names group 'projection'"):
        _groups(tmp_path / "bad", MisnamedGroups)


def test_the_optimizer_is_injected_and_keeps_the_groups_learning_rates(tmp_path):
    """``optimizer`` builds the optimizer from the phase's groups (their learning rates win over its default lr);
    without one, Adam with β = (0.9, 0.99)."""
    adamw = functools.partial(torch.optim.AdamW, weight_decay=0.01)
    module, groups = _groups(tmp_path, LearnedPRF, optimizer=adamw)
    optimizer = module.configure_optimizers()["optimizer"]
    assert type(optimizer) is torch.optim.AdamW
    assert {g["name"]: (g["initial_lr"], g["weight_decay"]) for g in optimizer.param_groups} == {
        name: (group["lr"], 0.01) for name, group in groups.items()
    }
    assert "optimizer" not in module.hparams  # an object, not a hyperparameter
    default, _ = _groups(tmp_path / "default", LearnedPRF)
    optimizer = default.configure_optimizers()["optimizer"]
    assert type(optimizer) is torch.optim.Adam and {g["betas"] for g in optimizer.param_groups} == {(0.9, 0.99)}
