"""Nothing loaded from a checkpoint can run code, and a checkpoint never silently overrides the command line.

Each malicious file's payload would create a marker folder when unpickled by ``torch.load(weights_only=False)``
(checked below, so the payload is known to work): planted as a run's ``last.ckpt`` (``--ckpt_path last``), as the
``meta.pt`` of a folder passed to ``--ckpt_path`` (a sharded checkpoint's layout) and passed directly as a file.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.resume import (
    ResumeMismatchError,
    UnreadableCheckpointError,
    UnsafeCheckpointError,
    checkpoint_metadata,
)
from tests.conftest import REPO
from tests.pipeline.conftest import fit_args
from tests.reliability.payloads import Payload


def _malicious(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": 2, "hyper_parameters": {"lr_z": 0.02}, "state_dict": {}, "x": Payload(marker)}, path)
    return path


def test_the_payload_runs_under_an_unsafe_load(tmp_path):
    """The control: the same file loaded the unsafe way does run its code (so the tests below can fail)."""
    marker = tmp_path / "pwned"
    torch.load(_malicious(tmp_path / "evil.ckpt", marker), weights_only=False)
    assert marker.is_dir()


@pytest.mark.parametrize("layout", ["planted_last", "sharded_folder", "file"])
def test_a_malicious_checkpoint_is_refused_by_name_and_runs_nothing(tmp_path, layout):
    marker = tmp_path / "pwned"
    if layout == "planted_last":  # a run's own checkpoint folder, found by --ckpt_path last
        evil = _malicious(tmp_path / "lit-dof" / "version_0" / "checkpoints" / "last.ckpt", marker)
        ckpt_path = "last"
    elif layout == "sharded_folder":  # a DCP checkpoint's folder: its metadata is meta.pt
        evil = _malicious(tmp_path / "evil.ckpt" / "meta.pt", marker)
        ckpt_path = str(evil.parent)
    else:
        evil = _malicious(tmp_path / "evil.ckpt", marker)
        ckpt_path = str(evil)
    with pytest.raises(UnsafeCheckpointError) as refused:
        build_cli(fit_args(tmp_path, steps=2, extra=[f"--ckpt_path={ckpt_path}"]))
    assert str(evil) in str(refused.value) and "GLOBAL posix.mkdir" in str(refused.value)
    assert "weights_only=False" not in str(refused.value)  # never advise the unsafe load
    assert not marker.exists()


def test_a_damaged_checkpoint_is_named_with_the_fix(tmp_path):
    """Random bytes fail the unpickler in many ways (EOFError, KeyError of a memo, …): each is named as damaged."""
    garbage = tmp_path / "random.ckpt"
    for seed in range(64):
        garbage.write_bytes(random.Random(seed).randbytes(4096))
        with pytest.raises(UnreadableCheckpointError, match=f"{garbage} is not a readable checkpoint.*delete it"):
            checkpoint_metadata(garbage)


def test_no_checkpoint_load_in_the_library_is_unsafe():
    """Every ``torch.load`` of lit_dof passes ``weights_only=True`` (the library reads no pickle of objects)."""
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "lit_dof").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "weights_only=False" in line or ("torch.load(" in line and "weights_only=True" not in line)
    ]
    assert not offenders, offenders


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-step run and its last checkpoint (pure linear attention, lr_z 0.02)."""
    run = tmp_path_factory.mktemp("finished")
    cli = build_cli(fit_args(run, steps=2, extra=["--trainer.limit_val_batches=0"]))
    return run, Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    ("option", "key", "saved", "given"),
    [
        ("--model.init_args.sliding_window.window=32", "model.sliding_window.window", "0", "32"),
        ("--model.init_args.lr_z=0.05", "model.lr_z", "0.02", "0.05"),
        ("--data.init_args.seq_len=32", "data.seq_len", "64", "32"),
    ],
)
def test_a_command_line_value_that_differs_from_the_checkpoint_is_refused(
    finished, tmp_path, option, key, saved, given
):
    """``--ckpt_path FILE``: LightningCLI would silently train with the checkpoint's value; lit-dof names the key,
    both values and the fix, before the teacher loads (for ``fit`` and ``validate``)."""
    _, last = finished
    for command in ("fit", "validate"):
        args = fit_args(tmp_path, steps=4, extra=[option, f"--ckpt_path={last}"])
        with pytest.raises(ResumeMismatchError) as refused:
            build_cli([command, *args[1:]])
        message = str(refused.value)
        assert f"{key}: {saved} in the checkpoint, {given} now" in message, message
        assert "config.yaml" in message and "without --ckpt_path" in message


def test_the_same_settings_resume_from_a_checkpoint_file(finished, tmp_path):
    _, last = finished
    cli = build_cli(fit_args(tmp_path, steps=3, extra=["--trainer.limit_val_batches=0", f"--ckpt_path={last}"]))
    assert cli.trainer.global_step == 3
