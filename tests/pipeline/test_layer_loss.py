"""The layer loss is injected by class path: a loss defined outside lit-dof is used; saved legacy strings load."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from lit_dof.hybrid.bank import bank_recipe
from lit_dof.pipeline.cli import build_cli
from lit_dof.students.layer_losses import KernelL2Loss, LayerLoss, OutputLoss, SoftmaxRowLoss
from tests.pipeline.conftest import fit_args


class RecordingLoss(LayerLoss):
    """A loss that lit-dof does not ship: block-output matching that records what each call received."""

    needs_values = True
    seen: ClassVar[list[tuple[bool, int | None]]] = []

    def __call__(self, twin, captured, *, query_rows=None, generator=None):
        RecordingLoss.seen.append((captured.v is not None and captured.out is not None, query_rows))
        return OutputLoss()(twin, captured)


def test_a_custom_loss_injected_by_class_path_trains_the_twins(tmp_path):
    RecordingLoss.seen.clear()
    path = f"{__name__}.RecordingLoss"
    cli = build_cli(fit_args(tmp_path, steps=1, extra=[f"--model.init_args.loss={path}"]))
    assert type(cli.model.layer_loss) is RecordingLoss and cli.trainer.global_step == 1
    assert RecordingLoss.seen and all(kept and rows == 32 for kept, rows in RecordingLoss.seen)  # v/out captured
    saved = yaml.safe_load((Path(cli.trainer.log_dir) / "config.yaml").read_text())
    assert saved["model"]["init_args"]["loss"]["class_path"] == path
    assert bank_recipe(Path(cli.trainer.log_dir) / "student").startswith("RecordingLoss loss, 1 steps")


@pytest.mark.parametrize("name, cls", [("softmax", SoftmaxRowLoss), ("l2", KernelL2Loss), ("output", OutputLoss)])
def test_saved_configs_with_legacy_loss_strings_still_load(tmp_path, name, cls):
    old = tmp_path / "config.yaml"
    old.write_text(f"model:\n  init_args:\n    loss: {name}\n")
    cli = build_cli(fit_args(tmp_path, steps=1, extra=["--config", str(old)])[1:], run=False)
    assert type(cli.model.layer_loss) is cls


def test_the_short_class_name_form_is_accepted(tmp_path):
    cli = build_cli(fit_args(tmp_path, steps=1, extra=["--model.init_args.loss=KernelL2Loss"])[1:], run=False)
    assert type(cli.model.layer_loss) is KernelL2Loss


def test_an_unknown_loss_string_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ValueError, match="'softmax', 'l2', 'output'.*got 'kl'"):
        build_cli(fit_args(tmp_path, steps=1, extra=["--model.init_args.loss=kl"])[1:], run=False)
