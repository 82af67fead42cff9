"""Random-weight teachers for rehearsals and the GPU check: dtypes, and a tokenizer padded to the architecture's
vocabulary that tokenises every text as the original does."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoTokenizer

from lit_dof.teacher.random_init import main, materialise_random_teacher, pad_tokenizer_vocab
from tests.conftest import TINYSTORIES

TEXTS = ["Once upon a time, there was a little dog named Spot.", "ünïcödé 123 <|lit_dof_unused_2100|> \n\t end"]


def _config(tmp_path, vocab_size):
    folder = tmp_path / "arch"
    folder.mkdir()
    spec = json.loads((TINYSTORIES / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**spec, "vocab_size": vocab_size}))
    return folder


def test_a_padded_tokenizer_reaches_the_vocabulary_and_tokenises_as_before(tmp_path):
    out = main(
        [
            str(tmp_path / "m"),
            "--tokenizer",
            str(TINYSTORIES),
            "--config",
            str(_config(tmp_path, 2500)),
            "--pad-vocab",
            "--dtype",
            "bfloat16",
        ]
    )
    padded, original = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(TINYSTORIES)
    assert (len(original), len(padded)) == (2048, 2500)
    for text in TEXTS:
        assert padded(text).input_ids == original(text).input_ids
    ids = {padded.convert_tokens_to_ids(f"<|lit_dof_unused_{i}|>") for i in range(2048, 2500)}
    assert ids == set(range(2048, 2500))  # every new id names its placeholder; no id used twice
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        hidden = json.loads((TINYSTORIES / "config.json").read_text())["hidden_size"]
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [2500, hidden]


def test_a_shorter_tokenizer_is_refused_unless_padding_is_asked_for(tmp_path):
    arch = _config(tmp_path, 2100)
    with pytest.raises(ValueError, match=r"2048 tokens .* vocab_size 2100.*--pad-vocab"):
        materialise_random_teacher(tmp_path / "m", TINYSTORIES, arch)
    with pytest.raises(ValueError, match="dtype must be"):
        materialise_random_teacher(tmp_path / "m", TINYSTORIES, arch, dtype="float16", pad_vocab=True)
    with pytest.raises(ValueError, match="2048 tokens, more than vocab_size 100"):
        pad_tokenizer_vocab(TINYSTORIES, 100)
    assert not (tmp_path / "m").exists()


def test_the_same_seed_gives_the_same_weights(tmp_path):
    arch = _config(tmp_path, 2048)
    a = materialise_random_teacher(tmp_path / "a", TINYSTORIES, arch, seed=3)
    b = materialise_random_teacher(tmp_path / "b", TINYSTORIES, arch, seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert torch.get_default_device().type == "cpu"  # the device context did not leak
