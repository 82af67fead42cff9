"""lm-eval as users run it: ``lit-dof lm-eval`` is lm-eval's CLI with the model ``lit_dof`` registered, and its
scores equal ``lit-dof eval``'s; without lm-eval installed, the commands that need it say how to install it."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from tests.conftest import DATA, TINYSTORIES, run_lit_dof

pytest.importorskip("lm_eval")
needs_data = pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    """A tiny student of TinyStories-656K (random feature maps), exported with its tokenizer."""
    from lit_dof.attention import LearnedPRF
    from lit_dof.students import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, tokenizer = load_teacher(TINYSTORIES)
    student = linearize(teacher, LearnedPRF, 8, seed=0).eval()
    path = tmp_path_factory.mktemp("lm_eval") / "student"
    student.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _run(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """``lit-dof ARGS`` in this process: (exit code, stdout, stderr)."""
    return run_lit_dof(capsys, monkeypatch, *args)


@pytest.fixture
def no_builtin_task_index(monkeypatch):
    """lm-eval's ``TaskManager`` without its index of lm-eval's ~10k built-in task files (20-50 s on 2 cores, for
    tasks these tests never run); ``--include_path`` folders are indexed as usual."""
    import functools

    from lm_eval.tasks import manager

    init = functools.partialmethod(manager.TaskManager.__init__, include_defaults=False)
    monkeypatch.setattr(manager.TaskManager, "__init__", init)


@needs_data
def test_lm_eval_cli_with_lit_dof_model_equals_lit_dof_eval(
    student_dir, tmp_path, capsys, monkeypatch, no_builtin_task_index
):
    import lm_eval

    from lit_dof.evaluation.cli import evaluate

    limit, batch = 12, 4
    code, out, err = _run(
        capsys,
        monkeypatch,
        "lm-eval",
        "run",
        "--model",
        "lit_dof",
        "--model_args",
        f"pretrained={student_dir}",
        "--device",
        "cpu",
        "--batch_size",
        str(batch),
        "--tasks",
        "lit_dof_arc_easy",
        "--limit",
        str(limit),
        "--metadata",
        json.dumps({"data_dir": str(DATA)}),
        "--output_path",
        str(tmp_path / "out"),
        "--log_samples",
    )
    assert code == 0, err
    assert "lit_dof_arc_easy" in out  # lm-eval's own results table
    (written,) = (tmp_path / "out").rglob("results_*.json")
    harness = json.loads(written.read_text())
    row = harness["results"]["lit_dof_arc_easy"]
    assert harness["config"]["model"] == "lit_dof"

    ours = evaluate(
        model=str(student_dir), tasks=["arc_easy"], data_dir=str(DATA), limit=limit, batch_size=batch, device="cpu"
    )
    entry = ours["tasks"]["arc_easy"]
    assert entry["n"] == limit
    assert row["acc,none"] == pytest.approx(entry["acc"], abs=1e-12)
    assert row["acc_norm,none"] == pytest.approx(entry["acc_norm"], abs=1e-12)
    (samples,) = (tmp_path / "out").rglob("samples_lit_dof_arc_easy_*.jsonl")
    docs = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda d: d["doc_id"])
    assert {m: [float(d[m]) for d in docs] for m in ("acc", "acc_norm")} == entry["items"]  # example by example
    assert ours["provenance"]["versions"]["lm_eval"] == lm_eval.__version__  # the version behind each number


@needs_data
def test_registered_model_loads_students_and_teachers(student_dir):
    from lm_eval.api.registry import get_model

    from lit_dof.evaluation.lm_eval_model import LitDofLM
    from lit_dof.students import LitDofForCausalLM

    assert get_model("lit_dof") is LitDofLM
    lm = LitDofLM(pretrained=str(student_dir), device="cpu")
    assert isinstance(lm.model, LitDofForCausalLM) and lm.backend == "causal"
    teacher = LitDofLM(pretrained=str(TINYSTORIES), device="cpu")
    assert not isinstance(teacher.model, LitDofForCausalLM)
    assert next(teacher.model.parameters()).dtype == torch.float32  # lit-dof eval's "auto" for a teacher


def test_shipped_tasks_are_included_unless_the_command_names_its_own():
    from lit_dof.evaluation.harness import TASK_DIR
    from lit_dof.evaluation.lm_eval_model import with_shipped_tasks

    assert with_shipped_tasks(["run", "--tasks", "t"]) == ["run", "--tasks", "t", "--include_path", str(TASK_DIR)]
    assert with_shipped_tasks(["ls", "tasks"])[-2:] == ["--include_path", str(TASK_DIR)]
    for own in (["--tasks", "t", "--include_path", "mine"], ["--tasks", "t", "--include_path=mine"]):
        assert with_shipped_tasks(own) == own
    for help_only in ([], ["--help"], ["-h"], ["run"]):
        assert with_shipped_tasks(help_only) == help_only


def test_lm_eval_help_names_the_model_and_lists_the_shipped_tasks(capsys, monkeypatch):
    """``lit-dof lm-eval --help``: a preamble with the model ``lit_dof`` and every shipped task (as lm-eval's own
    index of the task folder lists them), then lm-eval's own help."""
    from lm_eval.tasks import TaskManager

    from lit_dof.evaluation.harness import TASK_DIR
    from lit_dof.evaluation.lm_eval_model import help_preamble

    argv = list(sys.argv)
    code, out, _ = _run(capsys, monkeypatch, "lm-eval", "--help")
    preamble, _, own = out.partition("usage: lm-eval ")
    assert code == 0 and preamble == help_preamble() and "run" in own and "ls" in own
    assert "--model lit_dof --model_args pretrained=PATH" in preamble
    tasks = TaskManager(include_path=str(TASK_DIR), include_defaults=False).all_tasks
    assert len(tasks) >= 20 and set(preamble.split()) >= set(tasks)
    assert sys.argv == argv  # restored


def _documented_commands() -> list[list[str]]:
    """The ``lit-dof lm-eval`` commands of the module docstring and of the ``--help`` preamble, as words."""
    import shlex

    from lit_dof.evaluation import lm_eval_model

    commands = []
    for text in (lm_eval_model.__doc__, lm_eval_model.help_preamble()):
        joined = re.sub(r"\\\\?\n\s*", " ", text)  # a line ending in one backslash (two: a raw docstring) goes on
        commands += [
            shlex.split(line.strip())[2:] for line in joined.splitlines() if line.strip().startswith("lit-dof lm-eval ")
        ]
    return commands


@needs_data
def test_documented_commands_run(student_dir, capsys, monkeypatch, no_builtin_task_index):
    """Every ``lit-dof lm-eval`` command the docstring and ``--help`` show runs as written (the student and data
    paths filled in, ``--limit`` cut to 1)."""
    commands = _documented_commands()
    assert any("--help" in c for c in commands) and sum("--model_args" in c for c in commands) == 2
    for words in commands:
        filled = [
            re.sub(r"pretrained=[^,]+", f"pretrained={student_dir}", w).replace("/path/to/task/data", str(DATA))
            for w in words
        ]
        if "--limit" in filled:
            filled[filled.index("--limit") + 1] = "1"
        code, out, err = _run(capsys, monkeypatch, "lm-eval", *filled)
        assert code == 0, (words, err[-2000:])
        if "--help" not in words:
            assert "device=" in " ".join(words)  # the form that once raised "multiple values for keyword argument"
            for task in filled[filled.index("--tasks") + 1 :]:
                if task.startswith("--"):
                    break
                assert f"|{task}" in out.replace(" ", ""), task  # a row of lm-eval's results table


@pytest.mark.parametrize("command", [["eval", "--model", str(TINYSTORIES)], ["lm-eval", "ls", "tasks"]])
def test_without_lm_eval_the_commands_say_which_extra(capsys, monkeypatch, command):
    from lit_dof.evaluation import cli, extra

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ImportError, match=r"pip install 'lit-dof\[eval\]'"):
        extra.require_lm_eval("this")
    code, _, err = _run(capsys, monkeypatch, *command)
    assert code == 1
    assert (
        err.strip() == f"lit-dof: lit-dof {command[0]} needs lm-eval, an optional dependency of lit-dof: "
        "pip install 'lit-dof[eval]'"
    )


def test_without_lm_eval_the_harness_says_which_extra(monkeypatch):
    from lit_dof.evaluation.extra import MissingExtraError
    from lit_dof.evaluation.harness import evaluate_model, task_manager

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'lit-dof\[eval\]'"):
        evaluate_model(torch.nn.Linear(1, 1), None, ["piqa"])
    with pytest.raises(MissingExtraError, match=r"pip install 'lit-dof\[eval\]'"):
        task_manager()


@pytest.mark.slow  # imports all of lit_dof (Lightning included) in a fresh process
def test_every_module_but_the_lm_eval_model_classes_imports_without_lm_eval():
    import subprocess

    from tests.conftest import REPO

    probe = (
        "import importlib, pkgutil, sys\nsys.modules['lm_eval'] = None  # `import lm_eval` raises\n"
        "import lit_dof\n"
        "skip = ('lit_dof.__main__', 'lit_dof.evaluation.lm_eval_model', 'lit_dof.evaluation.batching')\n"
        "names = [m.name for m in pkgutil.walk_packages(lit_dof.__path__, 'lit_dof.')\n"
        "         if m.name not in skip and 'lm_eval_tasks' not in m.name]\n"
        "for name in names:\n    importlib.import_module(name)\nprint(len(names))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 50
