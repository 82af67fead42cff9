"""The shipped configs: resolved by name in a checkout and from an installed wheel (package data)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from lit_dof.config_files import config_description, config_path, config_root, copy_config, shipped_configs
from tests.conftest import REPO


def test_checkout_resolves_its_own_configs():
    assert config_root() == REPO / "configs"
    names = shipped_configs()
    assert names == sorted(
        p.relative_to(REPO / "configs").with_suffix("").as_posix() for p in (REPO / "configs").rglob("*.yaml")
    )
    assert {"quickstart", "methods/dof", "trainer/cpu", "models/smollm2-135m"} <= set(names)
    for name in ("quickstart", "quickstart.yaml", "configs/quickstart.yaml"):
        assert config_path(name) == REPO / "configs" / "quickstart.yaml"
    assert config_path("models/gpt2/config.json") == REPO / "configs" / "models" / "gpt2" / "config.json"
    assert config_description("methods/dof") == 'Learned PRF (the paper\'s map) with the "dof" allocation.'


@pytest.mark.parametrize("name", ["nope", "methods/nope.yaml", "../pyproject.toml", "../README.md"])
def test_unknown_or_outside_names_are_missing(name):
    with pytest.raises(FileNotFoundError, match="no shipped config"):
        config_path(name)


def test_copy_never_overwrites(tmp_path):
    written = copy_config("methods/fix", tmp_path)
    assert written == tmp_path / "fix.yaml" and written.read_text() == config_path("methods/fix").read_text()
    with pytest.raises(FileExistsError, match="not overwriting"):
        copy_config("methods/dof", written)
    assert written.read_text() == config_path("methods/fix").read_text()
    assert copy_config("quickstart", tmp_path / "mine.yaml").name == "mine.yaml"
    with pytest.raises(FileNotFoundError, match="no directory"):
        copy_config("quickstart", tmp_path / "missing" / "q.yaml")


def test_wheel_ships_the_configs_and_resolves_them_installed(tmp_path):
    """A non-editable install carries every file of configs/ as lit_dof.configs and finds them there, and every data
    file of the package (the lm-eval task YAMLs)."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("lit_dof", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, env=env)  # fmt: skip  # packed args
    wheel = next((tmp_path / "dist").glob("lit_dof-*.whl"))
    shipped = {
        p.relative_to(REPO / "configs").as_posix()
        for p in (REPO / "configs").rglob("*")
        if p.suffix in (".yaml", ".json")
    }
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packaged = {n.removeprefix("lit_dof/configs/") for n in names if n.startswith("lit_dof/configs/")}
    assert shipped <= packaged
    data = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "lit_dof").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc")
    }
    assert any(name.startswith("lit_dof/evaluation/lm_eval_tasks/") for name in data)
    assert data <= names
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
        check=True,
        env=env,
    )
    probe = (
        "import lit_dof, lit_dof.config_files as c; print(lit_dof.__file__); print(c.config_path('methods/dof'));"
        "print(len(c.shipped_configs()))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={**env, "PYTHONPATH": str(tmp_path / "site")}).stdout.split()  # fmt: skip  # packed args
    assert out[0] == str(tmp_path / "site" / "lit_dof" / "__init__.py")
    assert out[1] == str(tmp_path / "site" / "lit_dof" / "configs" / "methods" / "dof.yaml")
    assert int(out[2]) == len(shipped_configs())
    listed = subprocess.run([sys.executable, "-m", "lit_dof", "configs", "list"], cwd=tmp_path, capture_output=True,
                            text=True, check=True,
                            env={**env, "PYTHONPATH": str(tmp_path / "site")}).stdout  # fmt: skip  # packed args
    assert [line.split()[0] for line in listed.splitlines()] == shipped_configs()


def test_configs_that_choose_an_attention_state_every_window_option_the_quickstart_sets():
    """Method and hybrid files are composed after configs/quickstart.yaml: a file that sets ``sliding_window``
    must override every option the quickstart sets, or the quickstart's far-term choices leak into it (a pure
    linear method with the quickstart's far decay is refused; a window recipe would silently change)."""
    import yaml

    def window_keys(path):
        init = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("init_args") or {}
        return set(init["sliding_window"]) if "sliding_window" in init else None

    quickstart = window_keys(REPO / "configs" / "quickstart.yaml")
    assert {"window", "sink_tokens"} <= quickstart
    composed = [p for p in [*(REPO / "configs").rglob("*.yaml"), *(REPO / "tests" / "pipeline").glob("*.yaml")]
                if p.name != "quickstart.yaml" and window_keys(p) is not None]  # fmt: skip  # packed comprehension
    assert len(composed) >= 10
    missing = {p.relative_to(REPO).as_posix(): sorted(quickstart - window_keys(p)) for p in composed}
    assert {name: keys for name, keys in missing.items() if keys} == {}


def test_configs_that_choose_an_attention_state_whether_they_train_lora():
    """The quickstart trains a LoRA tail; a method or hybrid file that chooses its own attention was measured with
    or without one and must say which (``lora: null`` or its settings), or the quickstart's would leak into it."""
    import yaml

    def init_args(path):
        return ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("init_args") or {}

    assert init_args(REPO / "configs" / "quickstart.yaml")["lora"]["rank"] == 8
    choosing = [
        p
        for p in (REPO / "configs").rglob("*.yaml")
        if p.name != "quickstart.yaml" and "sliding_window" in init_args(p)
    ]
    assert len(choosing) >= 10
    assert sorted(p.relative_to(REPO).as_posix() for p in choosing if "lora" not in init_args(p)) == []
