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


def _model_init_args(path):
    import yaml

    return ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("init_args") or {}


def test_the_base_chooses_no_attention_and_no_shipped_file_undoes_one():
    """configs/base.yaml sets no attention pattern and no LoRA, so that a method or hybrid file composed over it
    only adds its one choice: none sets a ``sliding_window`` option to its default (window 0, no sinks, …) or
    ``lora: null`` — an undo of something the base never did."""
    from dataclasses import fields

    from lit_dof.attention import SlidingWindow

    base = _model_init_args(REPO / "configs" / "base.yaml")
    assert base and not {"sliding_window", "lora", "position_shift"} & set(base)
    defaults = {f.name: f.default for f in fields(SlidingWindow)}
    files = [*(REPO / "configs" / "methods").glob("*.yaml"), *(REPO / "configs" / "hybrid").glob("*.yaml")]
    assert len(files) >= 20
    undone = {}
    for path in files:
        init = _model_init_args(path)
        window = init.get("sliding_window") or {}
        resets = [f"sliding_window.{k}" for k, v in window.items() if v == defaults[k]]
        resets += ["lora"] if "lora" in init and init["lora"] is None else []
        if resets:
            undone[path.relative_to(REPO).as_posix()] = resets
    assert undone == {}


def test_the_quickstart_is_the_composition_its_row_names():
    """configs/quickstart.yaml, written out whole for the one-file command, composes to exactly what the
    ``quickstart_heads`` row of configs/compare/rows.yaml composes over configs/base.yaml (but for the logger's run
    name): the file and its parts cannot drift apart. The ``quickstart`` row is the same recipe without the exact
    heads: a constant decode state."""
    from lit_dof.comparison.rows import load_rows_file
    from lit_dof.pipeline.cli import parse_fit_config

    rows = {r.name: r for r in load_rows_file().rows}
    row = rows["quickstart_heads"]
    assert (
        row.configs == rows["quickstart"].configs == ("methods/swa_sink_linear_decay_norope.yaml", "methods/lora.yaml")
    )
    assert not rows["quickstart"].args and [a.split("=")[0] for a in row.args] == ["--model.init_args.exact_heads"]
    parts = [REPO / "configs" / "base.yaml", *(REPO / "configs" / name for name in row.configs)]
    args = [w for p in parts for w in ("--config", str(p))] + list(row.args)
    composed = parse_fit_config(args, instantiate=False).as_dict()
    whole = parse_fit_config(["--config", str(REPO / "configs" / "quickstart.yaml")], instantiate=False).as_dict()
    for config in (composed, whole):
        config.pop("config")
    assert composed["trainer"]["logger"]["init_args"].pop("name") == "lit-dof"
    assert whole["trainer"]["logger"]["init_args"].pop("name") == "quickstart"
    assert composed == whole
    window = whole["model"]["init_args"]["sliding_window"]  # the composition is the quickstart's, not a default
    assert (window["window"], window["sink_tokens"], window["far_decay"], window["far_rope"]) == (64, 4, 128, False)
    assert whole["model"]["init_args"]["lora"]["rank"] == 8
    exact = whole["model"]["init_args"]["exact_heads"]  # the probe: 20% of the teacher's KV heads, found at fit start
    assert exact["class_path"] == "lit_dof.pipeline.exact_heads.RetrievalHeads" and exact["init_args"] == {
        "share": 0.2,
        "items": 16,
        "block": 1024,
        "skip": 32,
        "seed": 0,
    }  # with these, SmolLM2-135M's are the 18 heads of docs/results/far_term (records/retrieval_heads_auto.json)
    gemma = [
        *("--config", str(REPO / "configs" / "quickstart.yaml")),
        "--config",
        str(REPO / "configs" / "models" / "gemma3-270m.yaml"),
    ]
    assert (
        parse_fit_config(gemma, instantiate=False).as_dict()["model"]["init_args"]["exact_heads"] == {}
    )  # not SmolLM2's
