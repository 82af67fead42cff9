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


@pytest.mark.parametrize("where", ["no data directory", "an empty data directory"])
def test_tasks_without_data_fail_before_the_model_loads_in_one_line(capsys, monkeypatch, tmp_path, where):
    from lit_dof.evaluation import cli

    monkeypatch.setenv("LIT_DOF_TUNE_ALLOCATOR", "0")
    monkeypatch.delenv("LIT_DOF_DATA", raising=False)
    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    data = [] if where == "no data directory" else ["--data_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--model", str(TINYSTORIES), "--tasks", "[arc_easy, passkey, mmlu]", *data])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("lit-dof eval: error: ")
    assert all(name in err for name in ("--data_dir", "LIT_DOF_DATA", "--builtin", "arc_easy", "mmlu"))
    assert "passkey" not in err  # generated: it needs no files
    if data:
        assert "missing arc/ARC-Easy-Test.jsonl, mmlu/test/*_test.csv" in err


def test_verbose_adds_the_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LIT_DOF_TUNE_ALLOCATOR", "0")
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--verbose", "--model", str(TINYSTORIES), "--tasks", "[piqa]", "--data_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" in err and "TaskDataError" in err
    assert err.strip().splitlines()[-1].startswith("lit-dof eval: error: no data for task(s) piqa")
