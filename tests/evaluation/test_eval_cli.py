"""``lit-dof eval --device/--dtype``: the model runs where and in the dtype asked for, the provenance says so,
and a bad value is refused before the model loads."""

from __future__ import annotations

import json

import pytest

from lit_dof.cli import main
from tests.conftest import DATA, TINYSTORIES


@pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")
def test_eval_in_bfloat16_records_device_and_dtype(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LIT_DOF_TUNE_ALLOCATOR", "0")
    output = tmp_path / "eval.json"
    main(["eval", "--model", str(TINYSTORIES), "--tasks", "[wsc273]", "--limit", "4", "--data_dir", str(DATA),
          "--device", "cpu", "--dtype", "bfloat16", "--output", str(output)])  # fmt: skip  # packed args
    provenance = json.loads(output.read_text())["provenance"]
    assert provenance["device"] == "cpu" and provenance["dtype"] == "bfloat16"
    assert "| wsc273 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "option, message",
    [
        ("--device=cuda:one", "use auto, cpu, cuda or cuda:N"),
        ("--dtype=fp8", "'auto', 'float32', 'bfloat16', 'float16'"),
    ],
)
def test_bad_device_or_dtype_is_refused_before_the_model_loads(capsys, monkeypatch, option, message):
    from lit_dof.evaluation import cli

    monkeypatch.setenv("LIT_DOF_TUNE_ALLOCATOR", "0")
    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--model", str(TINYSTORIES), option])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
