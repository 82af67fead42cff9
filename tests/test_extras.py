"""Optional dependencies: each missing one is named with the extra that installs it, by the library and by the
``lit-dof`` command (one line, no traceback). The imports are made to fail with ``sys.modules[name] = None``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lit_dof import cli, extras
from lit_dof.extras import EXTRA_OF, TRAIN_MODULES, MissingExtraError

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _distributions(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for r in requirements}


def test_each_extra_holds_the_packages_named_for_it():
    project = _pyproject()["project"]
    optional = {name: _distributions(reqs) for name, reqs in project["optional-dependencies"].items()}
    assert {"train", "eval", "plots", "gguf", "gpu", "test"} <= set(optional)
    distribution = {"lm_eval": "lm-eval", "fla": "flash-linear-attention"}
    for module, extra in EXTRA_OF.items():
        assert distribution.get(module, module) in optional[extra], (module, extra)
    assert {distribution.get(m, m) for m in TRAIN_MODULES} <= optional["train"]
    core = _distributions(project["dependencies"])
    assert not core & {"datasets", "tensorboard", "matplotlib", "peft", "gguf", "accelerate", "lm-eval"}
    assert not any("smollm2" in r for reqs in project["optional-dependencies"].values() for r in reqs)


@pytest.mark.parametrize(
    ("module", "extra"), [("peft", "train"), ("datasets", "train"), ("matplotlib", "plots"), ("gguf", "gguf")]
)
def test_require_names_the_extra(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError, match=rf"this feature needs {module}.*pip install 'lit-dof\[{extra}\]'"):
        extras.require(module, "this feature")


def test_require_all_names_only_the_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(MissingExtraError, match=r"^fit needs tensorboard, peft, .*: pip install 'lit-dof\[train\]'$"):
        extras.require_all(("datasets", "tensorboard", "peft"), "fit", "train")
    extras.require_all(("torch",), "fit", "train")


def test_lora_without_peft_names_the_train_extra(monkeypatch):
    from lit_dof.students.lora import LoRA, add_lora

    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MissingExtraError, match=r"LoRA .*needs peft.*pip install 'lit-dof\[train\]'"):
        add_lora(torch.nn.Sequential(torch.nn.Linear(2, 2)), LoRA())


def test_hub_corpus_without_datasets_names_the_train_extra(monkeypatch):
    from lit_dof.data.sources import HubDocuments

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingExtraError, match=r"wikimedia/wikipedia needs datasets.*pip install 'lit-dof\[train\]'"):
        HubDocuments("wikimedia/wikipedia", "20231101.en").load()


def test_hybrid_figure_without_matplotlib_names_the_plots_extra(monkeypatch):
    from lit_dof.hybrid import report
    from lit_dof.hybrid.record import SearchRecord
    from tests.conftest import REPO

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"matplotlib.*pip install 'lit-dof\[plots\]'"):
        report.plot(SearchRecord.load(REPO / "docs/results/hybrid/hybrid.json"))


def _main(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(list(args))
    return info.value.code, capsys.readouterr().err


def test_fit_without_the_train_extra_stops_at_once(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setattr("lit_dof.pipeline.cli.build_cli", lambda *a: pytest.fail("the CLI was built"), raising=False)
    code, err = _main(capsys, "fit", "--config", "configs/smoke.yaml")
    assert code == 1
    assert err.strip() == (
        "lit-dof: lit-dof fit needs tensorboard, optional dependencies of lit-dof: pip install 'lit-dof[train]'"
    )


@pytest.mark.parametrize(
    ("exc", "extra"),
    [
        (ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"), "plots"),
        (ModuleNotFoundError("No module named 'peft.tuners'", name="peft.tuners"), "train"),
        (ModuleNotFoundError("Neither `tensorboard` nor `tensorboardX` is available."), "train"),
        (ModuleNotFoundError("No module named 'gguf'", name="gguf"), "gguf"),
    ],
)
def test_a_command_that_meets_a_missing_package_names_its_extra(monkeypatch, capsys, exc, extra):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(cli, "run_command", fail)
    code, err = _main(capsys, "hybrid", "--help")
    assert code == 1 and err.startswith("lit-dof: ") and err.strip().endswith(f"pip install 'lit-dof[{extra}]'")
    assert "Traceback" not in err


def test_other_import_errors_are_not_dressed_up(monkeypatch):
    def fail(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'nonexistent_xyz'", name="nonexistent_xyz")

    monkeypatch.setattr(cli, "run_command", fail)
    with pytest.raises(ModuleNotFoundError, match="nonexistent_xyz"):
        cli.main(["hybrid", "--help"])
