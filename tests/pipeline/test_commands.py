"""The ``lit-dof`` command as users meet it: one help listing every command, each command's own usage line,
``--version``, ``configs list|show|copy``, and ``--optimizer`` refused instead of replacing the phase schedule."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from lit_dof.cli import COMMANDS, LIGHTNING_COMMANDS, TABLE, run_command
from lit_dof.config_files import config_description, config_path, shipped_configs
from tests.conftest import REPO, run_lit_dof

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")


def _lit_dof(*args: str, module: str = "lit_dof") -> subprocess.CompletedProcess:
    """``python -m lit_dof ARGS`` in a fresh process of this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """``lit-dof ARGS`` in this process, read from ``sys.argv`` as the console script does: (exit code, stdout,
    stderr)."""
    return run_lit_dof(capsys, monkeypatch, *args, argv=True)


def test_every_command_is_one_table_entry_whose_entry_point_is_what_runs(monkeypatch):
    """The dispatcher has no list of its own: each entry point imports and is called with the arguments after
    the command name; LightningCLI's commands (no entry point) go to ``build_cli`` with the whole command line."""
    import inspect

    from lit_dof.pipeline import cli as pipeline_cli

    calls = []
    for name, command in TABLE.items():
        if command.entry is None:
            assert name in LIGHTNING_COMMANDS
            continue
        module, function = command.entry.split(":")
        target = getattr(importlib.import_module(module), function)
        assert callable(target) and len(inspect.signature(target).parameters) == 1, command.entry
        monkeypatch.setattr(
            importlib.import_module(module), function, lambda args, name=name: calls.append((name, args))
        )
        run_command(name, [name, "--x", "1"], lightning_args=None)
    assert calls == [(name, ["--x", "1"]) for name, c in TABLE.items() if c.entry is not None]
    monkeypatch.setattr(pipeline_cli, "build_cli", lambda args: calls.append(("lightning", args)))
    run_command("fit", ["fit", "--x"], lightning_args=["fit", "--x"])
    assert calls[-1] == ("lightning", ["fit", "--x"]) and set(LIGHTNING_COMMANDS) <= set(TABLE)


def test_help_lists_every_command_without_importing_lightning():
    result = _lit_dof("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: lit-dof ")
    listed = {
        line.split()[0]: " ".join(line.split()[1:])
        for line in result.stdout.splitlines()
        if line.startswith("    ") and line.split()[0] in COMMANDS
    }
    expected = {
        "fit",
        "validate",
        "test",
        "predict",
        "eval",
        "lm-eval",
        "compare",
        "hybrid",
        "plan",
        "generate",
        "chat",
        "configs",
    }
    assert set(listed) == set(COMMANDS) == expected
    assert listed == COMMANDS  # one line each, as written
    probe = (
        "import sys\nfrom lit_dof.cli import main\ntry: main(['--help'])\n"
        "except SystemExit: print(sorted(m for m in ('lightning', 'torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("[]")


def test_version_is_the_installed_distribution_version():
    result = _lit_dof("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"lit-dof {importlib.metadata.version('lit-dof')}"


def test_unknown_or_missing_command_is_a_usage_error(capsys, monkeypatch):
    code, _, err = _main(capsys, monkeypatch, "fitt")
    assert code == 2 and "invalid choice: 'fitt'" in err and "'configs'" in err
    code, _, err = _main(capsys, monkeypatch)
    assert code == 2 and "required: COMMAND" in err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in ("fit", "validate", "test", "predict", "lm-eval")])
def test_each_command_has_its_own_usage_line(capsys, monkeypatch, command):
    code, out, _ = _main(capsys, monkeypatch, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: lit-dof {command} ")


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict"])
def test_lightning_commands_keep_lightning_cli_with_their_description(capsys, monkeypatch, command):
    code, out, _ = _main(capsys, monkeypatch, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: lit-dof [options] {command} ")
    assert COMMANDS[command] in " ".join(out.split())


def test_pipeline_module_entry_still_dispatches():
    """``python -m lit_dof.pipeline.cli`` (the entry older launch scripts run) is still the ``lit-dof`` command."""
    result = _lit_dof("--version", module="lit_dof.pipeline.cli")
    assert result.returncode == 0 and result.stdout.strip() == f"lit-dof {importlib.metadata.version('lit-dof')}"


def test_configs_list_show_copy(capsys, monkeypatch, tmp_path):
    code, out, _ = _main(capsys, monkeypatch, "configs", "list")
    assert code == 0
    rows = [line.split(maxsplit=1) for line in out.splitlines()]
    assert [row[0] for row in rows] == shipped_configs()
    assert {row[0]: row[1] if len(row) > 1 else "" for row in rows}["quickstart"] == config_description("quickstart")

    code, out, _ = _main(capsys, monkeypatch, "configs", "show", "methods/dof")
    assert code == 0 and out == config_path("methods/dof").read_text()

    monkeypatch.chdir(tmp_path)
    code, out, _ = _main(capsys, monkeypatch, "configs", "copy", "quickstart")
    assert code == 0 and (tmp_path / "quickstart.yaml").read_text() == config_path("quickstart").read_text()
    (tmp_path / "quickstart.yaml").write_text("# edited\n")
    code, _, err = _main(capsys, monkeypatch, "configs", "copy", "quickstart")
    assert code == 2 and "exists; not overwriting" in err
    assert (tmp_path / "quickstart.yaml").read_text() == "# edited\n"
    code, _, _ = _main(capsys, monkeypatch, "configs", "copy", "methods/fix", "mine.yaml")
    assert code == 0 and (tmp_path / "mine.yaml").read_text() == config_path("methods/fix").read_text()

    code, _, err = _main(capsys, monkeypatch, "configs", "show", "nope")
    assert code == 2 and "no shipped config 'nope'" in err


@pytest.mark.parametrize("where", ["command line", "config file"])
def test_optimizer_is_refused_with_the_fix(capsys, monkeypatch, tmp_path, where):
    if where == "command line":
        extra = ["--optimizer", "torch.optim.SGD", "--optimizer.lr", "0.1"]
    else:
        (tmp_path / "opt.yaml").write_text("optimizer:\n  class_path: torch.optim.SGD\n  init_args: {lr: 0.1}\n")
        extra = ["--config", str(tmp_path / "opt.yaml")]
    code, _, err = _main(capsys, monkeypatch, "fit", "--config", QUICKSTART, *extra)
    assert code == 2
    assert "lit-dof fit: error: --optimizer is not supported" in err and "--model.init_args.lr_z" in err


def test_saved_configs_with_null_optimizer_still_parse(capsys, monkeypatch, tmp_path):
    """Every saved run config has ``optimizer: null`` and ``lr_scheduler: null``; they stay valid input."""
    (tmp_path / "saved.yaml").write_text("optimizer: null\nlr_scheduler: null\n")
    code, out, _ = _main(
        capsys, monkeypatch, "fit", "--config", QUICKSTART, "--config", str(tmp_path / "saved.yaml"), "--print_config"
    )
    assert code == 0 and "optimizer: null" in out


def test_fit_without_corpus_or_network_fails_before_the_teacher_loads_in_one_line(capsys, monkeypatch, tmp_path):
    """No ``--data.init_args.path``, no ``$LIT_DOF_CORPUS``, offline: one line naming the fix, no traceback, no
    hub retries, no teacher loaded, no run directory left."""
    import time

    from tests.conftest import TINYSTORIES

    monkeypatch.delenv("LIT_DOF_CORPUS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("lit_dof.teacher.loading.load_teacher", lambda *a, **k: pytest.fail("the teacher loaded"))
    started = time.monotonic()
    code, _, err = _main(
        capsys,
        monkeypatch,
        "fit",
        "--config",
        QUICKSTART,
        f"--model.init_args.teacher={TINYSTORIES}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    )
    assert code == 1 and time.monotonic() - started < 30
    # A logging handler of an earlier test may write to its closed capture: drop those reports of the logging module.
    err = re.sub(r"--- Logging error ---.*?\nArguments: [^\n]*\n", "", err, flags=re.S)
    errors = [line for line in err.splitlines() if line.startswith("lit-dof")]
    assert len(errors) == 1 and "CorpusUnavailableError" not in err and "sources.py" not in err, err  # no traceback
    assert errors[0].startswith("lit-dof fit: error: no corpus: --data.init_args.path and $LIT_DOF_CORPUS are unset")
    assert "offline mode is on" in errors[0] and "--verbose" in errors[0]
    assert not list(tmp_path.rglob("version_*"))


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``lit-dof configs list | head -1``: the pipe closes after one line; the command stops quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lit_dof", "configs", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "LIT_DOF_TUNE_ALLOCATOR": "0"},
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader leaves, as `head -1` does
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert first.strip() and "Traceback" not in stderr and "BrokenPipeError" not in stderr
