"""Resume is bit-exact at any step: the quickstart's recipe in miniature (sliding window + sinks + a decaying far
term, ``teacher_reuse: 2``, random position offsets, an end-to-end tail with LoRA) resumed from a checkpoint at
every step — odd and even, before, at and after the layer-wise → tail switch — ends bit-equal to the uninterrupted
run; so does a run killed at an odd step, in one process and under 2-process DDP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from lit_dof.pipeline.cli import build_cli
from lit_dof.students import load_student
from tests.conftest import REPO
from tests.pipeline.conftest import fit_args

STEPS = 6  # finetune_fraction 0.5: steps 0–2 layer-wise (captures at 0 and 2), 3–5 end to end
CONFIGS = ("methods/lora.yaml",)  # composed before the options below (fit_args puts configs first)
RECIPE = [
    "--model.init_args.sliding_window.window=16", "--model.init_args.sliding_window.sink_tokens=2",
    "--model.init_args.sliding_window.far_decay=32", "--model.init_args.sliding_window.far_rope=false",
    "--model.init_args.teacher_reuse=2", "--model.init_args.finetune_fraction=0.5",
    "--model.init_args.position_shift=64", "--model.init_args.warmup_steps=2", "--trainer.limit_val_batches=0",
]  # fmt: skip  # option pairs


def _checkpoints(path: Path, dirpath: Path, every: int = 1, keep_all: bool = False, extra=()) -> list[str]:
    """A config file with a ModelCheckpoint every ``every`` steps into ``dirpath`` (``keep_all``: one file per step,
    ``step=N.ckpt``), plus ``extra`` callbacks."""
    init = {"dirpath": str(dirpath), "save_last": True, "every_n_train_steps": every}
    init.update({"save_top_k": -1, "filename": "{step}"} if keep_all else {"save_top_k": 0})
    callbacks = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": init}, *extra]
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return ["--config", str(path)]


def _weights(student_dir: Path) -> dict[str, torch.Tensor]:
    return load_student(student_dir).state_dict()


def _assert_bit_equal(a: dict, b: dict, label: str) -> None:
    assert a.keys() == b.keys() and a
    differ = {k: float((a[k].double() - b[k].double()).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not differ, (label, len(differ), sorted(differ.items(), key=lambda kv: -kv[1])[:3])


class _Killed(Exception):
    pass


class _KillAfter(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise _Killed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run, with a checkpoint kept at every step: (its exported student's weights, checkpoints)."""
    run = tmp_path_factory.mktemp("uninterrupted")
    cli = build_cli(
        fit_args(
            run, *CONFIGS, steps=STEPS, extra=[*RECIPE, *_checkpoints(run / "cb.yaml", run / "ckpt", keep_all=True)]
        )
    )
    assert cli.trainer.global_step == STEPS and cli.model.finetune_start() == 3
    return _weights(Path(cli.trainer.log_dir) / "student"), {
        s: run / "ckpt" / f"step={s}.ckpt" for s in range(1, STEPS)
    }


@pytest.mark.parametrize("step", range(1, STEPS))
def test_resumed_from_any_step_ends_bit_equal(uninterrupted, tmp_path, step):
    """Resumed from the checkpoint of step 1 (inside the first reuse pair), 2, 3 (the first tail step), 4 or 5."""
    reference, checkpoints = uninterrupted
    saved = torch.load(checkpoints[step], weights_only=True)
    assert saved["global_step"] == step and saved["lit_dof_teacher_reuse"]["batches"] == min(step, 3)
    cli = build_cli(fit_args(tmp_path, *CONFIGS, steps=STEPS, extra=[*RECIPE, f"--ckpt_path={checkpoints[step]}"]))
    assert cli.trainer.global_step == STEPS
    _assert_bit_equal(_weights(Path(cli.trainer.log_dir) / "student"), reference, f"resumed at step {step}")


def test_killed_at_an_odd_step_with_teacher_reuse_2_resumes_bit_equal(uninterrupted, tmp_path):
    """Killed at global step 1 (its last checkpoint; mid-pair: the next step reuses step 0's capture), resumed
    with ``--ckpt_path last``: the resumed step reuses step 0's capture, re-created from the same batch and
    positions (one extra teacher pass, no fresh batch) — bit-equal to the uninterrupted run."""
    reference, _ = uninterrupted
    args = fit_args(
        tmp_path, *CONFIGS, steps=STEPS, extra=[*RECIPE, *_checkpoints(tmp_path / "cb.yaml", tmp_path / "ckpt")]
    )
    cli = build_cli(args[1:], run=False)
    cli.trainer.callbacks.append(_KillAfter(1))
    with pytest.raises(_Killed):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 1 and last["lit_dof_teacher_reuse"] == {"every": 2, "batches": 1, "fresh_at": [0, 0]}
    resumed = build_cli(args + ["--ckpt_path=last"])
    assert resumed.trainer.global_step == STEPS
    _assert_bit_equal(_weights(Path(resumed.trainer.log_dir) / "student"), reference, "killed at step 1")


def _ddp_fit(run: Path, out: Path, kill_at: int = 0, resume: bool = False) -> subprocess.CompletedProcess:
    """The recipe for 4 steps (tail from step 2) under the shipped ``trainer/ddp.yaml`` on 2 CPU processes, with a
    checkpoint every step and :class:`~tests.pipeline.rank_probe.RankProbe` writing each rank's twins to ``out``."""
    probe = {
        "class_path": "tests.pipeline.rank_probe.RankProbe",
        "init_args": {"out_dir": str(out), "kill_at": kill_at},
    }
    run.mkdir(parents=True, exist_ok=True)
    callbacks = _checkpoints(run / f"cb_{kill_at}.yaml", run / "ckpt", extra=[probe])
    devices = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.precision=32-true"]
    args = fit_args(
        run,
        *CONFIGS,
        "trainer/ddp.yaml",
        steps=4,
        extra=[*devices, *RECIPE, *callbacks, *(["--ckpt_path=last"] * resume)],
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "lit_dof", *args]
    return subprocess.run(command, cwd=run, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_ddp_run_killed_at_an_odd_step_with_teacher_reuse_2_resumes_bit_equal(tmp_path):
    """2-process DDP, killed after global step 2 with its last checkpoint at step 1 (mid-pair; Lightning runs the
    checkpoint callback after the probe, so step 2's is never written): each rank re-creates its own kept capture
    (its own batch), and both ranks end bit-equal to the uninterrupted run's, twins and LoRA adapters."""
    reference = _ddp_fit(tmp_path / "reference", tmp_path / "reference" / "probe")
    assert reference.returncode == 0, reference.stderr[-6000:]
    run = tmp_path / "run"
    killed = _ddp_fit(run, run / "probe", kill_at=2)
    assert killed.returncode != 0 and "killed after step 2" in killed.stderr, killed.stderr[-6000:]
    last = torch.load(run / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 1 and last["lit_dof_teacher_reuse"]["batches"] == 1
    resumed = _ddp_fit(run, run / "probe", resume=True)
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    for rank in (0, 1):
        a = torch.load(run / "probe" / f"end_rank{rank}.pt", weights_only=True)
        b = torch.load(tmp_path / "reference" / "probe" / f"end_rank{rank}.pt", weights_only=True)
        assert a["step"] == b["step"] == 4
        _assert_bit_equal(a["twins"], b["twins"], f"rank {rank} twins")
        _assert_bit_equal(a["lora"], b["lora"], f"rank {rank} LoRA")
