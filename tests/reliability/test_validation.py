"""Bad input is refused before work (issue #39): a learning rate, step count, planner setting, block length or corpus
that cannot train stops ``lit-dof fit`` with an error naming the option (or file), the problem and the fix — before
the teacher's weights load, the DoF estimate or the q/k capture run."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import transformers

import lit_dof.teacher.loading as loading
from lit_dof.data.corpus import check_corpus, check_text, iter_documents
from lit_dof.evaluation.finetune import TaskFinetuning
from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.direct import DirectDistillation
from lit_dof.pipeline.layerwise import LayerwiseDistillation
from lit_dof.pipeline.planner import DoFPlanner, FixedPlanner
from lit_dof.pipeline.validation import check_fit_steps, check_position_shift, check_seq_len, teacher_config
from tests.conftest import TINYSTORIES, WIKIPEDIA
from tests.pipeline.conftest import fit_args

MODEL = "--model.init_args."
PLANNER = "--model.init_args.planner.init_args."


class _ExpensiveWorkRan(BaseException):
    """Raised by the patched teacher load and DoF estimate: a BaseException, so no ``pytest.raises(ValueError)``
    (nor a stray ``except Exception``) can swallow it."""


@pytest.fixture
def nothing_expensive(monkeypatch):
    """The teacher load and the DoF estimate raise :class:`_ExpensiveWorkRan`; returns the calls they saw."""
    calls = []

    def refuse(what):
        def patched(*args, **kwargs):
            calls.append(what)
            raise _ExpensiveWorkRan(f"{what} ran")

        return patched

    monkeypatch.setattr(loading, "load_teacher", refuse("teacher load"))
    monkeypatch.setattr(DoFPlanner, "plan", refuse("DoF estimate"))
    return calls


def _binary(tmp_path, name: str) -> str:
    """A 2 MB file of random bytes named ``name`` (gzip-compressed when it ends in .gz)."""
    path, data = tmp_path / name, os.urandom(2_000_000)
    if name.endswith(".gz"):
        with gzip.open(path, "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)
    return str(path)


# -- through the real CLI: refused at construction or at setup, before configure_model loads the teacher ---------
@pytest.mark.parametrize(
    "extra, error, named",
    [
        (["--trainer.max_steps=0"], ValueError, "--trainer.max_steps=0 trains nothing"),
        ([f"{MODEL}lr_z=-1"], ValueError, "lr_z=-1.0 (learning rate of the feature maps' projections z) is invalid"),
        ([f"{PLANNER}lam=-1"], ValueError, f"set {PLANNER}lam to such a value, e.g. auto"),
        (["--data.init_args.seq_len=1024"], ValueError, "set --data.init_args.seq_len <= 512"),
        ("random.txt", ValueError, "random.txt is not UTF-8 text"),
        ("directory", IsADirectoryError, "is a directory, not a corpus file"),
    ],
)
def test_bad_input_stops_the_fit_before_the_teacher_loads(
    tmp_path, monkeypatch, nothing_expensive, extra, error, named
):
    monkeypatch.setattr(sys, "argv", ["lit-dof"])  # the CLI reads only its args
    if isinstance(extra, str):  # a corpus
        path = str(tmp_path) if extra == "directory" else _binary(tmp_path, extra)
        extra = [f"--data.init_args.path={path}"]
    start = time.perf_counter()
    with pytest.raises(error) as info:
        build_cli(fit_args(tmp_path / "logs", steps=2, extra=extra))
    assert named in str(info.value).splitlines()[0]  # the constructor's own error, not jsonargparse's Union wrapper
    assert nothing_expensive == [] and time.perf_counter() - start < 20


def test_the_subprocess_exit_code_of_a_zero_step_fit(tmp_path):
    """Today's rc-0 case, as a user runs it: a non-zero exit, the option named, no weights loaded, nothing exported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lit_dof", *fit_args(tmp_path, steps=0)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip  # packed args
    output = done.stdout[-2000:] + done.stderr[-4000:]
    assert done.returncode != 0 and time.perf_counter() - start < 60, output  # ~13 s of CPU: < 20 s on 2 idle cores
    assert "ValueError: --trainer.max_steps=0 trains nothing" in done.stderr, output
    assert "Loading weights" not in done.stderr + done.stdout and not list(tmp_path.rglob("student"))


@pytest.mark.parametrize(
    "limits, needs_max_steps, named",
    [
        ({"max_steps": -1}, True, "--trainer.max_steps=-1 (unset) gives no step count"),
        ({"max_steps": -1, "max_epochs": 3}, True, "--trainer.max_steps=-1"),  # epochs of a stream without length
        ({"max_steps": 0}, False, "--trainer.max_steps=0 trains nothing"),
        ({"max_epochs": 0}, False, "--trainer.max_epochs=0 trains nothing"),
        ({"limit_train_batches": 0.0}, True, "--trainer.limit_train_batches=0 trains nothing"),
    ],
)
def test_fits_that_train_nothing_or_never_end_are_refused(limits, needs_max_steps, named):
    trainer = SimpleNamespace(**{"max_steps": 10, "max_epochs": None, "limit_train_batches": 1.0, **limits})
    with pytest.raises(
        ValueError, match=r"set (--trainer\.max_steps to the number of optimizer steps|it >= 1)"
    ) as info:
        check_fit_steps(trainer, needs_max_steps=needs_max_steps)
    assert named in str(info.value)


def test_fits_with_a_step_count_or_epochs_are_accepted():
    check_fit_steps(SimpleNamespace(max_steps=1, max_epochs=None, limit_train_batches=None), needs_max_steps=True)
    # TaskFinetuning trains by epochs over a finite task: no max_steps needed
    check_fit_steps(SimpleNamespace(max_steps=-1, max_epochs=3, limit_train_batches=1.0), needs_max_steps=False)


# -- the constructors: every learning rate finite and > 0, the schedule's ranges, the planners' settings ---------------
@pytest.mark.parametrize(
    "name, value",
    [("lr_z", -1.0), ("lr_z", 0.0), ("lr_alpha", math.nan), ("lr", math.inf), ("lr_lora", 0.0), ("lr_lora", -1e-3),
     ("warmup_steps", -1), ("min_lr_ratio", 1.5), ("min_lr_ratio", -0.1), ("finetune_lr_ratio", math.nan),
     ("kd_temperature", 0.0), ("query_rows", 0)],
)  # fmt: skip  # parametrize table
def test_layerwise_schedule_settings_are_refused_at_construction(name, value):
    with pytest.raises(ValueError, match=rf"^{name}=.* is invalid: it must be .*; set --model\.init_args\.{name} to"):
        LayerwiseDistillation(teacher="unused", **{name: value})


def test_direct_and_task_finetuning_settings_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"set --model\.init_args\.lr_z"):
        DirectDistillation(teacher="unused", lr_z=0.0)
    with pytest.raises(ValueError, match=r"logit_kd=-1\.0 .* must be a finite number >= 0"):
        DirectDistillation(teacher="unused", logit_kd=-1.0)
    with pytest.raises(
        ValueError, match=r"lr=0\.0 \(the fine-tuning learning rate\) is invalid.*--model\.init_args\.lr"
    ):
        TaskFinetuning(teacher="unused", lr=0.0)
    with pytest.raises(ValueError, match=r"warmup_steps=-2 .* an integer >= 0"):
        TaskFinetuning(teacher="unused", warmup_steps=-2)


def test_legitimate_schedules_are_accepted():
    module = LayerwiseDistillation(teacher="unused", lr_z=1e-5, lr_alpha=3.0, lr=1, lr_lora=1e-6, warmup_steps=0,
                                   min_lr_ratio=0.0, finetune_lr_ratio=2.0, query_rows=None)  # fmt: skip
    assert (module.lr_z, module.warmup_steps, module.min_lr_ratio) == (1e-5, 0, 0.0)
    assert LayerwiseDistillation(teacher="unused", min_lr_ratio=1.0).min_lr_ratio == 1.0  # a constant rate
    assert DirectDistillation(teacher="unused", logit_kd=0.0).logit_kd == 0.0
    assert TaskFinetuning(teacher="unused", lr=2e-5, warmup_steps=0).lr == 2e-5


@pytest.mark.parametrize(
    "kwargs, name",
    [({"lam": -1.0}, "lam"), ({"lam": 0.0}, "lam"), ({"lam": math.nan}, "lam"), ({"lam": "nan"}, "lam"),
     ({"lam": "inf"}, "lam"), ({"lam": "big"}, "lam"), ({"min_dim": 0}, "min_dim"), ({"multiple_of": 0}, "multiple_of"),
     ({"budget": 0}, "budget"), ({"num_samples": 1}, "num_samples"), ({"num_batches": 0}, "num_batches"),
     ({"target_fraction": 0.0}, "target_fraction"), ({"target_fraction": 1.0}, "target_fraction"),
     ({"lam": 0.5, "relative_to": "trace", "min_dim": -3}, "min_dim")],
)  # fmt: skip  # parametrize table
def test_planner_settings_are_refused_at_construction(kwargs, name):
    with pytest.raises(
        ValueError, match=rf"^{name}=.* is invalid: .*; set --model\.init_args\.planner\.init_args\.{name}"
    ):
        DoFPlanner(**kwargs)


def test_legitimate_planner_settings_are_accepted():
    assert DoFPlanner(lam="auto").lam == "auto"
    assert DoFPlanner(lam="1e-3").lam == 1e-3 and DoFPlanner(lam=2).lam == 2.0  # a YAML string, an int
    assert DoFPlanner(lam=0.1, relative_to="max_eigenvalue", num_samples=2, num_batches=1, budget=1).lam == 0.1
    with pytest.raises(ValueError, match=r"feature_dim must be >= 1, got 0: set --model\.init_args\.planner"):
        FixedPlanner(feature_dim=0)
    assert FixedPlanner().feature_dim is None and FixedPlanner(feature_dim=4).feature_dim == 4


# -- the teacher's positions, read from its config without weights ---------------------------------------------------
def test_teacher_positions_are_read_without_weights(tmp_path, nothing_expensive):
    config = teacher_config(str(TINYSTORIES))
    assert config.max_position_embeddings == 512
    check_seq_len(config, 512)  # the limit itself is fine
    with pytest.raises(ValueError, match=r"seq_len=513 exceeds the teacher's max_position_embeddings \(512\)"):
        check_seq_len(config, 513)
    check_position_shift(config, 64, 448)
    check_position_shift(config, 64, "auto")  # resolved to fit once the teacher is loaded
    with pytest.raises(ValueError, match=r"position_shift \+ seq_len = 449 \+ 64 exceeds"):
        check_position_shift(config, 64, 449)
    gpt2 = transformers.GPT2Config(n_positions=128)
    with pytest.raises(ValueError, match="absolute position embeddings"):
        check_position_shift(gpt2, 16, 8)
    check_seq_len(transformers.PretrainedConfig(), 10**6)  # no max_position_embeddings: nothing to check
    (tmp_path / "empty").mkdir()
    assert teacher_config(str(tmp_path / "empty")) is None  # unreadable without weights: the load will say why
    assert teacher_config(str(tmp_path / "missing.gguf")) is None and nothing_expensive == []


def test_setup_checks_the_module_against_the_teacher_config(nothing_expensive):
    """``setup`` (every stage) hands the module's own seq_len and position_shift to the checks."""
    shifted = LayerwiseDistillation(teacher=str(TINYSTORIES), seq_len=64, position_shift=500)
    with pytest.raises(ValueError, match=r"position_shift \+ seq_len = 500 \+ 64 exceeds .* <= 448"):
        shifted.setup("validate")
    with pytest.raises(ValueError, match=r"seq_len=600 exceeds"):
        DirectDistillation(teacher=str(TINYSTORIES), seq_len=600).setup("test")
    LayerwiseDistillation(teacher=str(TINYSTORIES), seq_len=512, position_shift="auto").setup("validate")
    assert nothing_expensive == []


# -- the corpus: directories named as such, binary content refused by content, real text accepted -------------------
def test_a_directory_is_named_as_one(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "wiki.txt.gz").write_bytes(b"")
    with pytest.raises(IsADirectoryError, match=r"corpus is a directory, not a corpus file; pass a .*\(it holds wiki"):
        next(iter_documents(tmp_path / "corpus"))


_NOISE = random.Random(0).randbytes(200_000)  # the same bytes in every process (pytest-xdist compares test ids)
BINARY_CORPORA = [
    ("random.txt", _NOISE, "is not UTF-8 text"),
    ("random.jsonl", _NOISE, "is not UTF-8 text"),
    ("random.txt.gz", gzip.compress(_NOISE, mtime=0), r"is not UTF-8 text: .* \(decompressed\)"),
    ("random-not-gzip.txt.gz", _NOISE, "is not a readable gzip file"),
    ("compressed.txt", gzip.compress(b"plain text\n" * 100, mtime=0), "is gzip-compressed but not named .gz"),
    ("utf16.txt", "An English text in UTF-16.\n\n".encode("utf-16") * 100, r"NUL bytes"),
]


@pytest.mark.parametrize("name, content, message", BINARY_CORPORA, ids=[name for name, _, _ in BINARY_CORPORA])
def test_binary_corpora_are_refused_by_content(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        check_corpus(tmp_path / name, _Tokenizer(), seq_len=4, val_every=100, train_blocks=1, val_blocks=1)
    assert str(tmp_path / name) in str(info.value)


class _Tokenizer:
    """One token per character, EOS id 0."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] * len(text)}


@pytest.mark.parametrize(
    "name, text",
    [
        ("english.txt", "A plain English document.\n\nAnother one, with tabs\tand form feeds\f.\n"),
        (
            "multilingual.txt",
            "Москва — столица России.\n\n北京是中国的首都。\n\nالقاهرة عاصمة مصر. 🎉\n\nÉlève à l'école.\n",
        ),
        ("lines.jsonl", json.dumps({"text": "Zürich liegt in der Schweiz."}) + "\n"),
    ],
)
def test_real_text_passes(tmp_path, name, text):
    (tmp_path / name).write_text(text * 2000, encoding="utf-8")  # beyond the 64 KiB sample: a cut character is fine
    check_text(tmp_path / name)
    found = check_corpus(tmp_path / name, _Tokenizer(), seq_len=8, val_every=100, train_blocks=1, val_blocks=1)
    assert found["documents"] >= 2


def test_the_wikipedia_corpus_passes():
    check_text(WIKIPEDIA)


@pytest.mark.parametrize(
    "setting", [{"seq_len": 0}, {"seq_len": 1}, {"batch_size": 0}, {"val_every": 0}, {"val_blocks": -1}]
)
def test_data_module_sizes_are_refused_at_construction(setting):
    """A ``seq_len`` of 0 would pack blocks forever and a ``val_every`` of 0 divide by zero: refused by name."""
    from lit_dof.data.datamodule import WikipediaDataModule

    ((name, value),) = setting.items()
    with pytest.raises(ValueError, match=rf"^{name}={value} is invalid: .* set --data.init_args.{name} "):
        WikipediaDataModule(**setting)
