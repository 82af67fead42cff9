"""Atomic writes: a failure leaves the previous content; a success replaces it completely."""

import json
import os
import stat
import sys

import pytest

from lit_dof.io import (
    REPO_ROOT,
    atomic_directory,
    atomic_file,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    library_versions,
    portable,
)


def test_atomic_directory_replaces_or_keeps(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("first")
    assert (target / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "first"
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_write_json(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})
    monkeypatch.setattr(json, "dumps", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        atomic_write_json(path, {"a": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_atomic_file_replaces_or_keeps(tmp_path):
    path = tmp_path / "samples.pt"
    atomic_write_bytes(path, b"first")
    with pytest.raises(RuntimeError):
        with atomic_file(path) as handle:
            handle.write(b"half")
            raise RuntimeError("killed")
    assert path.read_bytes() == b"first"
    with atomic_file(path, binary=False) as handle:
        handle.write("second")
    assert path.read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["samples.pt"]


def test_library_versions():
    import torch

    import lit_dof

    versions = library_versions()
    assert list(versions) == ["torch", "transformers", "lit_dof"]
    assert versions["torch"] == torch.__version__ and versions["lit_dof"] == lit_dof.__version__
    assert library_versions(["no-such-package-lit-dof"]) == {"no-such-package-lit-dof": None}


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_atomic_writes_get_plain_permissions(tmp_path, umask_027):
    """Not mkstemp's 0o600 / mkdtemp's 0o700: what open()/mkdir() give under the umask, or the replaced file's."""
    path = tmp_path / "report.md"
    atomic_write_text(path, "a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0o666 & ~0o027
    path.chmod(0o604)
    atomic_write_text(path, "b")
    assert stat.S_IMODE(path.stat().st_mode) == 0o604 and path.read_text() == "b"
    target = tmp_path / "student"
    with atomic_directory(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert stat.S_IMODE(target.stat().st_mode) == 0o750  # 0o777 & ~0o027
    target.chmod(0o755)
    with atomic_directory(target):
        pass
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


def test_portable_drops_this_machines_paths():
    command = [sys.executable, "-m", "lit_dof", "--config", str(REPO_ROOT / "configs" / "quickstart.yaml"),
               f"--data.init_args.path={REPO_ROOT.parent}/shared/corpus.txt"]  # fmt: skip  # compact list
    assert portable(command) == (
        "python -m lit_dof --config configs/quickstart.yaml --data.init_args.path=../shared/corpus.txt"
    )
