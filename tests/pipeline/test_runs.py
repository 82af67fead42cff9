"""Runs keep to themselves: checkpoints live in each run's own version directory, ``--ckpt_path last`` continues
in that directory, and a checkpoint of another experiment is refused instead of resumed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.resume import ResumeMismatchError, check_resume, checkpointed_version, factory_name
from tests.conftest import REPO
from tests.pipeline.conftest import fit_args


def _fit(tmp_path, steps: int = 2, extra=()):
    return build_cli(fit_args(tmp_path, steps=steps, extra=list(extra)))


def test_no_shipped_config_fixes_a_checkpoint_folder():
    """A fixed ``dirpath`` is shared by every experiment of a config; Lightning's default is the run's own."""
    for path in (REPO / "configs").rglob("*.yaml"):
        callbacks = ((yaml.safe_load(path.read_text()) or {}).get("trainer") or {}).get("callbacks") or []
        for callback in callbacks:
            assert "dirpath" not in (callback.get("init_args") or {}), path


def test_two_experiments_in_one_directory_keep_their_own_checkpoints(tmp_path):
    first = _fit(tmp_path)
    second = _fit(tmp_path, extra=["--model.init_args.lr_z=0.05"])
    runs = tmp_path / "lit-dof"
    assert Path(first.trainer.log_dir) == runs / "version_0" and Path(second.trainer.log_dir) == runs / "version_1"
    for version, lr_z in ((0, 0.02), (1, 0.05)):
        checkpoint = torch.load(runs / f"version_{version}" / "checkpoints" / "last.ckpt", weights_only=False)
        assert checkpoint["hyper_parameters"]["lr_z"] == lr_z and checkpoint["global_step"] == 2
    assert not list(tmp_path.rglob("runs/lit-dof/checkpoints"))  # the old shared folder (cwd-relative)


def _bar_states(out: str) -> list[str]:
    """The states a tqdm bar went through in captured output (each redraw starts with a carriage return)."""
    return [state.strip() for line in out.splitlines() for state in line.split("\r") if state.strip()]


def test_resume_continues_in_the_same_version_directory(tmp_path, capsys):
    """…with the estimate's settings changed: its dims come from the run's own dof.json (``report_path``). The
    console shows the run directory at the start and end, the student's folder, and a bar over the optimizer steps
    of the whole run (lit_dof.pipeline.console), after the resume too."""
    bar = ["--trainer.enable_progress_bar=true"]
    _fit(tmp_path, extra=bar)
    run = tmp_path / "lit-dof" / "version_0"
    states = _bar_states(capsys.readouterr().out)
    assert states[0] == f"run directory: {run}"
    assert states[-2:] == [f"run directory: {run}", f"student: {run / 'student'}"]
    steps = [state for state in states if state.startswith("step ")]
    assert steps[0].startswith("step 0/2 [") and steps[-1].startswith("step 2/2 [")
    assert re.search(r"tok/s=[\d.]+k?, loss=[\d.]+", steps[-1]) and "val/ppl_student=" in steps[-1]
    assert not [state for state in states if "v_num" in state or "Epoch" in state]
    (tmp_path / "lit-dof" / "version_1").mkdir()  # a later run killed before its first checkpoint
    planner = "--model.init_args.planner.init_args"
    extra = ["--ckpt_path=last", f"{planner}.num_samples=32", f"{planner}.report_path={run / 'dof.json'}", *bar]
    resumed = _fit(tmp_path, steps=4, extra=extra)
    steps = [state for state in _bar_states(capsys.readouterr().out) if state.startswith("step ")]
    assert steps[0].startswith("step 2/4 [") and steps[-1].startswith("step 4/4 [")
    assert Path(resumed.trainer.log_dir) == run and resumed.trainer.global_step == 4
    assert Path(resumed.trainer.ckpt_path) == run / "checkpoints" / "last.ckpt"  # restored, not started afresh
    assert sorted(p.name for p in (tmp_path / "lit-dof").iterdir()) == ["version_0", "version_1"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    assert (run / "student" / "config.json").is_file() and len(list(run.glob("events.out.tfevents.*"))) == 2
    assert checkpointed_version(tmp_path / "lit-dof") == 0


def test_resuming_another_experiments_checkpoint_is_refused(tmp_path):
    _fit(tmp_path)
    with pytest.raises(ResumeMismatchError) as refused:
        _fit(
            tmp_path,
            steps=4,
            extra=[
                "--ckpt_path=last",
                "--model.init_args.lr_z=0.05",
                "--model.init_args.planner.init_args.budget=8",
                "--data.init_args.num_workers=1",
            ],
        )
    message = str(refused.value)
    assert "model.lr_z: 0.02 in the checkpoint, 0.05 now" in message
    assert "planner.budget: None in the checkpoint, 8 now" in message
    assert "num_workers" not in message  # free to change on resume
    assert "version_0/config.yaml" in message and "without --ckpt_path" in message
    checkpoint = torch.load(tmp_path / "lit-dof" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 2  # untouched


def test_feature_map_factories_are_told_apart_by_class_and_init_args():
    """What a config's ``feature_map`` becomes (jsonargparse's partial) is named by its class and arguments."""
    from collections.abc import Callable

    from jsonargparse import ArgumentParser

    from lit_dof.attention import FeatureMap, LearnedPRF

    parser = ArgumentParser()
    parser.add_argument("--f", type=Callable[[int, int, int], FeatureMap])

    def name(value: str) -> str:
        return factory_name(parser.instantiate_classes(parser.parse_args(["--f", value])).f)

    performer = '{"class_path": "lit_dof.attention.PerformerFeatureMap", "init_args": {"seed": %d}}'
    assert name("lit_dof.attention.LearnedPRF").startswith("lit_dof.attention.feature_maps.prf.LearnedPRF(")
    assert "PerformerFeatureMap(" in name(performer % 3) and name(performer % 3) != name(performer % 4)
    assert factory_name(LearnedPRF) == "lit_dof.attention.feature_maps.prf.LearnedPRF"


def test_check_resume_compares_only_shared_keys(tmp_path):
    saved = {"model.lr_z": 0.02, "model.old_option": 1, "model.export_dir": "a"}
    check_resume(tmp_path / "last.ckpt", saved, {"model.lr_z": 0.02, "model.new_option": 2, "model.export_dir": "b"})
    with pytest.raises(ResumeMismatchError, match=r"model\.feature_map: 'a\.A' in the checkpoint, 'b\.B' now"):
        check_resume(tmp_path / "last.ckpt", {"model.feature_map": "a.A"}, {"model.feature_map": "b.B"})
