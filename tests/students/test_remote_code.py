"""Students load the standard way: ``auto_map`` and two code files that import the installed lit-dof, so plain
transformers, ``pipeline`` and lm-eval's ``hf`` model load a student with ``trust_remote_code=True`` in a process
that never imports lit-dof itself; without lit-dof (or with an older one) the error names the install line.

One subprocess (:func:`plain_process`) runs every check that needs a process without lit-dof, in an order that
keeps lit-dof out of it until the first real load: the two failing loads, lm-eval's CLI, then the model and the
pipeline. The tests compare what it reports with the same student in this process (lit-dof imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lit_dof.attention import LearnedPRF
from lit_dof.students import LitDofConfig, LitDofForCausalLM, linearize
from lit_dof.students.remote_code import AUTO_MAP, CONFIG_CODE_FILE, MODEL_CODE_FILE, write_remote_code, writer_version
from tests.conftest import REPO, TINYSTORIES, run_lit_dof, tiny_model

needs_tinystories = pytest.mark.skipif(not TINYSTORIES.is_dir(), reason="needs ../shared/models/TinyStories-656K")

PROMPT = "Once upon a time there was a little"
TASK = "tiny_story_choice"
WORDS = ("dog", "cat", "girl", "boy", "bird", "tree")

PROBE = r"""
import functools, json, runpy, sys, types
from pathlib import Path

student, task_dir, out, task, prompt = sys.argv[1:6]  # lm-eval's CLI rewrites sys.argv below
report = {"imported_at_start": "lit_dof" in sys.modules}
import torch
from transformers import AutoConfig, AutoModelForCausalLM, pipeline


class NoLitDof:  # lit-dof not installed
    def find_spec(self, name, path=None, target=None):
        if name == "lit_dof" or name.startswith("lit_dof."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


errors = {}
sys.meta_path.insert(0, NoLitDof())
try:
    AutoConfig.from_pretrained(student, trust_remote_code=True)
except ImportError as exc:
    errors["missing"] = str(exc)
sys.meta_path.pop(0)
sys.modules["lit_dof"] = types.SimpleNamespace(__version__="0.0.1")  # an older lit-dof
try:
    AutoConfig.from_pretrained(student, trust_remote_code=True)
except ImportError as exc:
    errors["old"] = str(exc)
del sys.modules["lit_dof"]
report["errors"] = errors
report["imported_before_lm_eval"] = any(n == "lit_dof" or n.startswith("lit_dof.") for n in sys.modules)

# lm-eval's CLI as `python -m lm_eval` runs it; only its index of ~10k built-in task files is skipped (CI time).
from lm_eval.tasks import manager

manager.TaskManager.__init__ = functools.partialmethod(manager.TaskManager.__init__, include_defaults=False)
sys.argv = ["lm_eval", "--model", "hf", "--model_args", f"pretrained={student},trust_remote_code=True",
            "--device", "cpu", "--tasks", task, "--include_path", task_dir, "--limit", "5",
            "--output_path", str(Path(out) / "hf"), "--log_samples"]
try:
    runpy.run_module("lm_eval", run_name="__main__", alter_sys=True)
    report["lm_eval_exit"] = 0
except SystemExit as exc:
    report["lm_eval_exit"] = exc.code

model = AutoModelForCausalLM.from_pretrained(student, trust_remote_code=True)
report["class"] = f"{type(model).__module__}.{type(model).__qualname__}"
with torch.no_grad():
    torch.save(model(torch.load(Path(out) / "ids.pt")).logits, Path(out) / "logits.pt")
model.save_pretrained(Path(out) / "resaved")
report["resaved"] = {
    "code": sorted(p.name for p in (Path(out) / "resaved").glob("*.py")),
    "auto_map": json.loads((Path(out) / "resaved" / "config.json").read_text())["auto_map"],
}
generate = pipeline("text-generation", model=student, trust_remote_code=True)
report["generated"] = generate(prompt, max_new_tokens=8, do_sample=False)[0]["generated_text"]
print(json.dumps(report))
"""


def _tiny_task(folder: Path) -> Path:
    """A 6-document multiple-choice task over a local jsonl file (lm-eval's ``json`` builder, no hub)."""
    folder.mkdir()
    rows = [{"query": f"{PROMPT} {w}. The {w} was", "choices": ["happy", "a", "blue"], "gold": 0} for w in WORDS]
    (folder / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'docs.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: query\ndoc_to_choice: choices\n"
        "doc_to_target: gold\nmetric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "metadata: {version: 1.0}\n"
    )
    return folder


@pytest.fixture(scope="module")
def plain_process(tmp_path_factory):
    """A TinyStories student (trained-looking feature maps, one softmax layer) with its tokenizer, and what the
    subprocess :data:`PROBE` reports about it."""
    pytest.importorskip("lm_eval")
    if not TINYSTORIES.is_dir():
        pytest.skip("needs ../shared/models/TinyStories-656K")
    from lit_dof.teacher.loading import load_teacher

    root = tmp_path_factory.mktemp("remote_code")
    teacher, tokenizer = load_teacher(str(TINYSTORIES))
    student = linearize(teacher, LearnedPRF, 8, seed=0, softmax_layers=[1]).eval()
    generator = torch.Generator().manual_seed(1)
    for twin in student.linear_modules().values():  # weights that a fresh seed-0 init would not reproduce
        for p in twin.feature_map.parameters():
            p.data.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    folder = root / "student"
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = root / "out"
    out.mkdir()
    ids = torch.randint(3, 2000, (2, 11), generator=torch.Generator().manual_seed(0))
    torch.save(ids, out / "ids.pt")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),  # the installed lit-dof, for the folder's code files (the probe never imports it)
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(root / "datasets"),
        "HF_MODULES_CACHE": str(root / "modules"),
    }
    command = [sys.executable, "-c", PROBE, str(folder), str(_tiny_task(root / "task")), str(out), TASK, PROMPT]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return {"student": student, "tokenizer": tokenizer, "folder": folder, "out": out, "ids": ids, **report}


def test_plain_transformers_loads_the_student_with_trust_remote_code(plain_process):
    """The subprocess, which never imported lit-dof, got lit-dof's own class (no copied model code) with the saved
    weights: its logits and greedy pipeline text equal this process's."""
    from transformers import pipeline

    folder = plain_process["folder"]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    assert not plain_process["imported_at_start"] and not plain_process["imported_before_lm_eval"]
    assert plain_process["class"] == "lit_dof.students.modeling.LitDofForCausalLM"
    for name in (CONFIG_CODE_FILE, MODEL_CODE_FILE):  # they import lit-dof's classes and define none
        text = (folder / name).read_text()
        assert "\nclass " not in text and "from lit_dof.students." in text
    with torch.no_grad():
        expected = plain_process["student"](plain_process["ids"]).logits
    torch.testing.assert_close(torch.load(plain_process["out"] / "logits.pt"), expected, rtol=0, atol=0)
    local = pipeline("text-generation", model=plain_process["student"], tokenizer=plain_process["tokenizer"])
    assert plain_process["generated"] == local(PROMPT, max_new_tokens=8, do_sample=False)[0]["generated_text"]


def test_without_lit_dof_or_with_an_older_one_the_error_names_the_install_line(plain_process):
    install = f'pip install "lit-dof>={writer_version()}"'
    errors = plain_process["errors"]
    assert errors["missing"] == (
        f"this model is a lit-dof student: loading it needs the lit-dof package, which is not installed: {install}"
    )
    assert errors["old"] == (
        f"this model was written by lit-dof {writer_version()}; the installed lit-dof is 0.0.1: {install}"
    )


def test_lm_eval_hf_model_scores_the_student_as_lit_dof_lm_eval_does(plain_process, capsys, monkeypatch):
    """``lm_eval --model hf --model_args pretrained=S,trust_remote_code=True`` exits 0 with a result, and every
    option's log-likelihood equals the ``lit_dof`` model's in ``lit-dof lm-eval`` here (the documented
    ``device=`` in ``--model_args``)."""
    import functools

    from lm_eval.tasks import manager

    assert plain_process["lm_eval_exit"] in (0, None)
    (hf_results,) = (plain_process["out"] / "hf").rglob("results_*.json")
    hf = json.loads(hf_results.read_text())
    assert hf["config"]["model"] == "hf" and hf["n-samples"][TASK]["effective"] == 5
    monkeypatch.setattr(
        manager.TaskManager, "__init__", functools.partialmethod(manager.TaskManager.__init__, include_defaults=False)
    )
    code, _, err = run_lit_dof(
        capsys,
        monkeypatch,
        "lm-eval",
        "--model",
        "lit_dof",
        "--model_args",
        f"pretrained={plain_process['folder']},device=cpu",
        "--tasks",
        TASK,
        "--include_path",
        str(plain_process["folder"].parent / "task"),
        "--limit",
        "5",
        "--output_path",
        str(plain_process["out"] / "lit_dof"),
        "--log_samples",
    )
    assert code == 0, err
    (ours_results,) = (plain_process["out"] / "lit_dof").rglob("results_*.json")
    assert json.loads(ours_results.read_text())["results"][TASK]["acc,none"] == hf["results"][TASK]["acc,none"]

    def scores(run: str) -> list:
        (samples,) = (plain_process["out"] / run).rglob(f"samples_{TASK}_*.jsonl")
        docs = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda d: d["doc_id"])
        return [d["filtered_resps"] for d in docs]

    assert scores("hf") == scores("lit_dof") and len(scores("hf")) == 5


def test_a_student_saved_before_the_code_files_loads_as_before_and_can_get_them(tmp_path):
    """A folder without ``auto_map`` and code files loads through ``import lit_dof`` unchanged;
    :func:`write_remote_code` gives it both, and ``trust_remote_code`` then reads them."""
    student = linearize(tiny_model("llama"), LearnedPRF, 8, seed=0)
    folder = tmp_path / "old"
    student.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"]
    (folder / "config.json").write_text(json.dumps(config))
    for name in (CONFIG_CODE_FILE, MODEL_CODE_FILE):
        (folder / name).unlink()
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = student(ids).logits
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(folder)(ids).logits, expected, rtol=0, atol=0)
    written = write_remote_code(folder)
    assert sorted(p.name for p in written) == sorted([CONFIG_CODE_FILE, MODEL_CODE_FILE, "config.json"])
    assert json.loads((folder / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert isinstance(AutoConfig.from_pretrained(folder, trust_remote_code=True), LitDofConfig)
    with pytest.raises(ValueError, match="not a lit-dof student"):
        (tmp_path / "plain").mkdir()
        tiny_model("llama").config.save_pretrained(tmp_path / "plain")
        write_remote_code(tmp_path / "plain")


def test_saving_a_student_loaded_through_remote_code_copies_no_lit_dof_source(plain_process):
    """A ``trust_remote_code`` load makes transformers mark the loaded classes for its Auto classes, after which
    its ``save_pretrained`` copies the file defining them (``lit_dof/students/modeling.py``) into the folder; a
    student saved again in the subprocess holds only its own code files and ``auto_map``."""
    assert plain_process["resaved"] == {"code": sorted([CONFIG_CODE_FILE, MODEL_CODE_FILE]), "auto_map": AUTO_MAP}
    for cls, auto in ((LitDofForCausalLM, "AutoModelForCausalLM"), (LitDofConfig, "AutoConfig")):
        cls.register_for_auto_class(auto)  # what transformers calls after such a load
        assert cls._auto_class is None
