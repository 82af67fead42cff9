"""Shared fixtures: tiny random-initialised models of every supported family, local data, real teachers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LIT_DOF_DATA", REPO.parent / "shared" / "data")).resolve()  # tests chdir (below)
MODELS = DATA.parent / "models"
WIKIPEDIA = DATA / "wikipedia" / "enwiki_wikiextractor_AA.txt.gz"
TINYSTORIES = MODELS / "TinyStories-656K"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # scripts/test.sh runs the suite on every core (pytest-xdist, one worker per core): one thread per worker and
    # per process a test starts, so that the workers do not oversubscribe the cores (OpenMP threads spin).
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    torch.set_num_threads(1)


def tiny_config(family: str):
    """A tiny random config of ``family`` whose attention is far from uniform (large init)."""
    import transformers as tf

    common = dict(vocab_size=97, initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        return tf.LlamaConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
    if family == "mistral":
        return tf.MistralConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=256,
            sliding_window=None,
            **common,
        )
    if family == "qwen2":
        return tf.Qwen2Config(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
    if family == "gpt2":
        return tf.GPT2Config(
            n_embd=64, n_layer=3, n_head=4, n_positions=256, scale_attn_by_inverse_layer_idx=True, **common
        )
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=256,
            rotary_pct=0.25,
            **common,
        )
    if family == "gemma3_text":
        return tf.Gemma3TextConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"] * 2,
            query_pre_attn_scalar=12,
            **common,
        )
    raise KeyError(family)


FAMILIES = ["llama", "mistral", "qwen2", "gpt2", "gpt_neox", "gemma3_text"]


def tiny_model(family: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family), attn_implementation="sdpa")
    return model.eval().requires_grad_(False)


def padded_batch(vocab: int = 97, seed: int = 0, lengths=(12, 7, 10), side: str = "left"):
    """A batch of sequences of different lengths, padded on ``side``: (input_ids, attention_mask)."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        row = torch.randint(3, vocab, (n,), generator=g)
        if side == "left":
            ids[i, T - n :], mask[i, T - n :] = row, 1
        else:
            ids[i, :n], mask[i, :n] = row, 1
    return ids, mask


def load_script(name: str, folder: str = "scripts"):
    """Import ``<folder>/<name>.py`` (``scripts/`` or ``tools/``) as a module (neither folder is a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def save_tokenizer(directory) -> None:
    """Put a real tokenizer (TinyStories-656K's) next to a tiny model so that ``load_teacher`` accepts it."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(TINYSTORIES).save_pretrained(directory)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Directory of the converted embedded SmolLM2-135M-Instruct teacher (converted once per cache)."""
    pytest.importorskip("gguf")
    from lit_dof.teacher.loading import embedded_gguf_path, gguf_to_safetensors

    return gguf_to_safetensors(embedded_gguf_path("smollm2-135m-instruct"))


def wikipedia_ids(tokenizer, count: int, length: int, skip: int = 5000) -> torch.Tensor:
    """``(count, length)`` token ids from long Wikipedia documents after the first ``skip`` (held-out slice)."""
    import itertools

    from lit_dof.data.corpus import iter_documents

    rows = []
    for doc in itertools.islice(iter_documents(WIKIPEDIA), skip, None):
        ids = tokenizer(doc, return_tensors="pt").input_ids[0]
        if ids.numel() >= length:
            rows.append(ids[:length])
        if len(rows) == count:
            return torch.stack(rows)
    raise RuntimeError("not enough long documents")


@pytest.fixture(autouse=True)
def _isolated_working_directory(tmp_path, monkeypatch):
    """Every test runs in its own temporary directory, so relative output paths of the shipped configs
    (e.g. the quickstart's ``runs/quickstart/checkpoints``) never land in the repository. Relative paths in
    ``$LIT_DOF_CORPUS`` / ``$LIT_DOF_DATA`` (e.g. ``../shared/...`` exported in the shell) are made absolute
    first, so they keep pointing where the user meant."""
    for name in ("LIT_DOF_CORPUS", "LIT_DOF_DATA"):
        if os.environ.get(name):
            monkeypatch.setenv(name, os.path.abspath(os.environ[name]))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def bf16_default_dtype():
    """``torch.set_default_dtype(torch.bfloat16)`` for one test (what Lightning's ``bf16-true`` does around
    ``configure_model`` and every step), restored afterwards even if the test fails."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        yield torch.bfloat16
    finally:
        torch.set_default_dtype(previous)


def run_lit_dof(capsys, monkeypatch, *args: str, argv: bool = False) -> tuple[int, str, str]:
    """``lit-dof ARGS`` in this process: (exit code, stdout, stderr). ``argv``: read from ``sys.argv`` as the
    console script does, instead of passed to ``main``."""
    from lit_dof.cli import main

    monkeypatch.setenv("LIT_DOF_TUNE_ALLOCATOR", "0")
    if argv:
        monkeypatch.setenv("COLUMNS", "100")
        monkeypatch.setattr(sys, "argv", ["lit-dof", *args])
    code = 0
    try:
        main() if argv else main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err
