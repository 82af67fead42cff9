"""Hygiene of what runs leave behind (issue #39, part 6): a run that fails before training leaves no empty version
directory, killed atomic writes leave no temporaries that the next save keeps, and a resumed run leaves one
``metrics.jsonl`` line per (step, metric). Nothing written is ever lost on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lit_dof.io import abandoned_siblings, atomic_directory, atomic_file, atomic_write_text, host_tag
from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.run_cleanup import FailedRunCleanup, own_events_file
from lit_dof.pipeline.run_files import METRICS_FILE, drop_metrics_from
from lit_dof.teacher.loading import TeacherNotFoundError
from tests.pipeline.conftest import fit_args

# -- a run that fails before training ------------------------------------------------------------------------------


class _Refused(Exception):
    pass


class _FailingModel(BoringModel):
    """Fails in ``configure_model`` (after every callback's ``setup``) or in its ``fail_at_step``-th training step."""

    def __init__(self, fail_at_step: int | None = None):
        super().__init__()
        self.fail_at_step = fail_at_step

    def configure_model(self):
        if self.fail_at_step is None:
            raise _Refused("refused in configure_model")

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at_step:
            raise _Refused("failed while training")
        return super().training_step(batch, batch_idx)


def _fit(logger, model, callbacks=()):
    trainer = L.Trainer(max_steps=3, logger=logger, callbacks=[FailedRunCleanup(), *callbacks], log_every_n_steps=1,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with pytest.raises(_Refused):
        trainer.fit(model)
    return trainer


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_whose_teacher_fails_to_load_leaves_no_version_directory(tmp_path):
    """The tokenizer fails in the data module's setup, before any callback's setup: only the events file exists."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(TeacherNotFoundError):
        build_cli(fit_args(tmp_path / "runs", extra=[f"--model.init_args.teacher={tmp_path / 'empty'}"]))
    assert list((tmp_path / "runs" / "lit-dof").iterdir()) == []


def test_a_setting_refused_in_configure_model_leaves_no_version_directory_and_others_alone(tmp_path):
    """After the callbacks' setup: LightningCLI wrote config.yaml too. An older version beside it is untouched."""
    older = tmp_path / "runs" / "lit-dof" / "version_0"
    older.mkdir(parents=True)
    (older / "events.out.tfevents.1.otherhost.1.0").write_bytes(b"older run")
    missing = tmp_path / "nowhere" / "dof.json"
    with pytest.raises(FileNotFoundError, match="report_path"):
        build_cli(fit_args(tmp_path / "runs", extra=[f"--model.init_args.planner.init_args.report_path={missing}"]))
    assert [p.name for p in (tmp_path / "runs" / "lit-dof").iterdir()] == ["version_0"]
    assert _files(older) == {"events.out.tfevents.1.otherhost.1.0": b"older run"}


@pytest.mark.parametrize("logger_class", [TensorBoardLogger, CSVLogger])
def test_a_failure_in_configure_model_removes_only_this_runs_directory(tmp_path, logger_class):
    _fit(logger_class(tmp_path, name="x"), _FailingModel())
    assert list((tmp_path / "x").iterdir()) == []


def test_a_directory_holding_anything_else_is_kept_whole(tmp_path):
    """An explicit version that already held a file, and one holding an events file of another process."""
    for version, foreign in (("notes", "notes.txt"), ("other", f"events.out.tfevents.{int(time.time())}.h.1.0")):
        log_dir = tmp_path / "x" / version
        log_dir.mkdir(parents=True)
        (log_dir / foreign).write_text("keep")
        _fit(TensorBoardLogger(tmp_path, name="x", version=version), _FailingModel())
        names = sorted(p.name for p in log_dir.iterdir())
        assert foreign in names and any(own_events_file(name, 0) for name in names)  # ours too: nothing removed


def test_a_run_that_trained_keeps_its_directory(tmp_path):
    trainer = _fit(TensorBoardLogger(tmp_path, name="x"), _FailingModel(fail_at_step=1))
    assert trainer.global_step == 1 and any(Path(trainer.log_dir).glob("events.out.tfevents.*"))


def test_a_disabled_cleanup_keeps_the_directory(tmp_path):
    trainer = L.Trainer(max_steps=1, logger=TensorBoardLogger(tmp_path, name="x"), enable_progress_bar=False,
                        callbacks=[FailedRunCleanup(enabled=False)], enable_model_summary=False)  # fmt: skip
    with pytest.raises(_Refused):
        trainer.fit(_FailingModel())
    assert any((tmp_path / "x" / "version_0").glob("events.out.tfevents.*"))


def test_own_events_file_needs_this_host_this_pid_and_a_recent_time():
    import socket

    now, host, pid = int(time.time()), socket.gethostname(), os.getpid()
    assert own_events_file(f"events.out.tfevents.{now}.{host}.{pid}.3", now)
    assert own_events_file(f"events.out.tfevents.{now}.{host}.{pid}.0.suffix", now - 5)
    assert not own_events_file(f"events.out.tfevents.{now - 1}.{host}.{pid}.3", now)  # before this run
    assert not own_events_file(f"events.out.tfevents.{now}.{host}.{pid}1.3", now)  # another pid
    assert not own_events_file(f"events.out.tfevents.{now}.not-{host}.{pid}.3", now)
    assert not own_events_file("config.yaml", now)


# -- temporaries of killed atomic writes --------------------------------------------------------------------------


@pytest.fixture
def pids():
    """(a pid that is certainly dead: a child that exited and was reaped, a live sleeping child's pid)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield dead.pid, sleeper.pid
    sleeper.kill()
    sleeper.wait()


def _leftovers(parent: Path, name: str, kind: str, dead: int, live: int) -> dict[str, Path]:
    """One leftover of each kind of writer, as a folder holding a file."""
    host = host_tag()
    names = {
        "dead": f".{name}.{kind}-{host}-{dead}-abc_123x",
        "live": f".{name}.{kind}-{host}-{live}-abc_123x",
        "self": f".{name}.{kind}-{host}-{os.getpid()}-abc_123x",
        "other host": f".{name}.{kind}-otherhost-{dead}-abc_123x",
        "legacy": f".{name}.{kind}-{dead}" if kind == "old" else f".{name}.{kind}-abc_123x",
    }
    paths = {}
    for who, leftover in names.items():
        paths[who] = parent / leftover
        paths[who].mkdir()
        (paths[who] / "weights.bin").write_bytes(b"x")
    return paths


def test_a_save_removes_temporaries_of_dead_writers_of_this_host_only(tmp_path, pids):
    dead, live = pids
    target = tmp_path / "student"
    tmps = _leftovers(tmp_path, "student", "tmp", dead, live)
    olds = _leftovers(tmp_path, "student", "old", dead, live)
    assert abandoned_siblings(target) == [tmps["dead"]] and abandoned_siblings(target, "old") == [olds["dead"]]
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            assert tmp.name.startswith(f".student.tmp-{host_tag()}-{os.getpid()}-")
            raise RuntimeError("killed")
    assert not tmps["dead"].exists() and olds["dead"].is_dir()  # no target yet: the old copy may be the only one
    with atomic_directory(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert not olds["dead"].exists() and (target / "config.json").read_text() == "{}"
    kept = sorted(p.name for p in tmp_path.iterdir())
    expected = [p.name for who, p in [*tmps.items(), *olds.items()] if who != "dead"]
    assert kept == sorted([*expected, "student"])
    assert all((tmp_path / name / "weights.bin").exists() for name in expected)


def test_a_replaced_directory_goes_through_an_old_name_of_this_writer(tmp_path, monkeypatch):
    target = tmp_path / "student"
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("1")
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append(Path(dst).name), real_replace(src, dst)))
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("2")
    assert renames[0].startswith(f".student.old-{host_tag()}-{os.getpid()}-") and renames[1] == "student"
    assert (target / "a").read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["student"]


def test_an_atomic_file_removes_temporary_files_of_dead_writers_of_this_host_only(tmp_path, pids):
    dead, live = pids
    host = host_tag()
    stale = tmp_path / f".dof.json.tmp-{host}-{dead}-k2j4h_9q"
    alive = tmp_path / f".dof.json.tmp-{host}-{live}-k2j4h_9q"
    legacy = tmp_path / ".dof.json.k2j4h_9q"  # mkstemp's name before host and pid
    other = tmp_path / f".other.json.tmp-{host}-{dead}-k2j4h_9q"  # another target's
    for path in (stale, alive, legacy, other):
        path.write_text("partial")
    with atomic_file(tmp_path / "dof.json", binary=False) as handle:
        assert not stale.exists() and alive.exists()  # removed before writing
        assert any(p.name.startswith(f".dof.json.tmp-{host}-{os.getpid()}-") for p in tmp_path.iterdir())
        handle.write("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, legacy, other)) + ["dof.json"]


def test_the_host_tag_is_one_word_without_dashes():
    tag = host_tag()
    assert tag and "-" not in tag and "/" not in tag and tag == host_tag()


# -- metrics.jsonl across a resume ---------------------------------------------------------------------------------


def test_drop_metrics_from_keeps_earlier_and_unreadable_lines_and_drops_a_partial_tail(tmp_path):
    path = tmp_path / METRICS_FILE
    lines = ['{"step":0,"a":1}', '{"step":1,"a":2}', "garbled{", '{"time":3,"note":"no step"}', '{"step":2,"a":3}']
    path.write_text("\n".join(lines) + '\n{"step":1,"a":')
    assert drop_metrics_from(path, 2) == 2
    assert path.read_text().splitlines() == lines[:4]
    inode = path.stat().st_ino
    assert drop_metrics_from(path, 2) == 0 and path.stat().st_ino == inode  # nothing to drop: not rewritten
    assert drop_metrics_from(tmp_path / "missing.jsonl", 0) == 0 and not (tmp_path / "missing.jsonl").exists()
    atomic_write_text(path, '{"step":0,"a":1}\n{"step":5,"a":2}')  # a whole last record without its newline
    assert drop_metrics_from(path, 5) == 1 and path.read_text() == '{"step":0,"a":1}\n'


class _Killed(Exception):
    pass


class _KillAt(L.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 3:
            raise _Killed


def test_a_killed_run_outlives_a_failed_resume_and_its_resume_logs_each_step_once(tmp_path):
    """Killed after step 3, last checkpoint at step 2 with a validation just before it (logged at step 1). A resume
    refused in configure_model changes nothing of the run. The resume: the killed run's lines of steps 0–1 stay byte
    for byte, its partial last line goes, steps 2–3 are the resumed run's."""
    callbacks = tmp_path / "callbacks.yaml"
    callbacks.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"save_last": True, "every_n_train_steps": 2, "save_top_k": 0}},
        {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
    ]}}))  # fmt: skip  # packed config
    fixed_lam = "--model.init_args.planner.init_args.lam=2e13"  # about what "auto" picks, without its search
    args = fit_args(tmp_path, steps=4, extra=["--config", str(callbacks), "--trainer.val_check_interval=2", fixed_lam])
    cli = build_cli(args[1:], run=False)
    cli.trainer.callbacks.append(_KillAt())
    with pytest.raises(_Killed):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    run = tmp_path / "lit-dof" / "version_0"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    killed = (run / METRICS_FILE).read_text().splitlines()
    assert {json.loads(line)["step"] for line in killed} == {0, 1, 2}  # step 2: its learning rates
    with open(run / METRICS_FILE, "a") as f:
        f.write('{"step":2,"train/loss":')  # killed while writing

    before = _files(run)
    missing = tmp_path / "nowhere" / "dof.json"
    with pytest.raises(FileNotFoundError, match="report_path"):
        build_cli(args + ["--ckpt_path=last", f"--model.init_args.planner.init_args.report_path={missing}"])
    after = _files(run)
    assert {"checkpoints/last.ckpt", METRICS_FILE, "dof.json"} <= set(before)
    del before["config.yaml"]  # LightningCLI rewrites it at every start, a failed one included
    assert {name: after[name] for name in before} == before  # the rest as it was; our events file beside it
    assert [p.name for p in (tmp_path / "lit-dof").iterdir()] == ["version_0"]

    resumed_at = time.time()
    build_cli(args + ["--ckpt_path=last"])

    lines = (run / METRICS_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line whole
    assert lines[: sum(r["step"] < 2 for r in records)] == [line for line in killed if json.loads(line)["step"] < 2]
    assert all((r["time"] >= resumed_at) == (r["step"] >= 2) for r in records)
    pairs = Counter((r["step"], key) for r in records for key in r if key not in ("step", "time", "epoch"))
    assert max(pairs.values()) == 1
    steps = {key: sorted(step for step, k in pairs if k == key) for _, key in pairs}
    assert steps["train/loss"] == steps["lr-Adam/z"] == list(range(4)) and steps["val/ppl_student"] == [1, 3]
