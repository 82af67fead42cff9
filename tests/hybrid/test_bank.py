"""What a twin bank says about itself: its training recipe and its layers' DoF."""

from __future__ import annotations

import pytest

from lit_dof.dof.report import DoFReport
from lit_dof.hybrid.bank import bank_recipe, check_bank, layer_dof


def test_bank_recipe_reads_the_fit_config_next_to_the_bank(tmp_path):
    student = tmp_path / "version_0" / "student"
    student.mkdir(parents=True)
    assert bank_recipe(student) is None  # no config.yaml: nothing is claimed
    (tmp_path / "version_0" / "config.yaml").write_text(
        "trainer:\n  max_steps: 400\nmodel:\n  init_args:\n    loss: output\n    finetune_fraction: 0.0\n"
    )
    assert bank_recipe(student) == "output loss, 400 steps, no end-to-end tail"
    (tmp_path / "version_0" / "config.yaml").write_text(
        "trainer:\n  max_steps: 800\nmodel:\n  init_args:\n    loss: softmax\n    finetune_fraction: 0.3\n"
    )
    assert bank_recipe(student) == "softmax loss, 800 steps, end-to-end tail 30% of the steps"


def _dof_report(layer_dof: list[float]) -> DoFReport:
    heads = [[n] for n in layer_dof]
    return DoFReport("m", "llama", 4, "kv_head", 1.0, "absolute", None, 8, 32, heads, layer_dof, [True, True], {})


def test_layer_dof_prefers_dof_json_next_to_the_bank_else_one_up_else_feature_dims(tmp_path):
    student = tmp_path / "version_0" / "student"
    student.mkdir(parents=True)
    assert layer_dof(student, [4, 8]) == ({0: 4.0, 1: 8.0}, "feature dims (no dof.json)")
    _dof_report([2.5, 7]).save(tmp_path / "version_0" / "dof.json")  # as the fit writes it
    assert layer_dof(student, [4, 8]) == ({0: 2.5, 1: 7.0}, "dof.json")
    _dof_report([1, 3]).save(student / "dof.json")
    assert layer_dof(student, [4, 8]) == ({0: 1.0, 1: 3.0}, "dof.json")


def test_check_bank_names_the_command_that_makes_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="hybrid/twins.yaml"):
        check_bank(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    check_bank(tmp_path)
