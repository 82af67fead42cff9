"""Random-initialised teachers built from an architecture file: rehearse a recipe's shapes without its weights.

A rehearsal runs the real recipe (configs, strategy, precision, launch) on a model of the same family, layer
count and head layout as the target but with shrunk widths, so that every per-layer and per-head code path
(DoF estimate, allocation, sharding at the decoder layer, GQA grouping, export) is exercised in minutes on
a CPU. The shipped tiny config :data:`LLAMA_3_8B_TINY` (``configs/models/llama-3-8b-tiny/config.json``) is
Llama-3-8B's 32 layers, 32 query heads and 8 KV heads (GQA 4:1, untied embeddings, RoPE θ 5·10⁵) at
hidden size 256 (head size 8), MLP width 512 and the 2048-token vocabulary of TinyStories-656K's tokenizer.
No weights are shipped: :func:`materialise_random_teacher` writes a model directory ``load_teacher`` accepts.
A full-size architecture (``configs/models/llama-3-8b``) can be materialised the same way for a memory and speed
check on a GPU: bf16 weights drawn on the device, and a local tokenizer padded to the architecture's vocabulary
(:func:`pad_tokenizer_vocab`) when the real one cannot be downloaded.

    python -m lit_dof.teacher.random_init OUT_DIR --tokenizer ../shared/models/TinyStories-656K
    python -m lit_dof.teacher.random_init OUT_DIR --config configs/models/llama-3-8b --tokenizer DIR --pad-vocab \
        --dtype bfloat16 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from lit_dof.config_files import config_path

LLAMA_3_8B_TINY = config_path("models/llama-3-8b-tiny/config.json").parent
"""Folder of the shipped tiny Llama-3-8B-family architecture (``config.json`` only)."""


def materialise_random_teacher(
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    config_dir: str | os.PathLike = LLAMA_3_8B_TINY,
    seed: int = 0,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    pad_vocab: bool = False,
) -> Path:
    """Write a random-initialised causal LM (safetensors, ``save_pretrained``) and a tokenizer to ``out_dir``.

    The weights are drawn with the family's own initialiser (``initializer_range`` of the config) from
    ``seed`` on ``device``, inside a forked RNG (the caller's global RNG is untouched), so the same arguments
    give the same bytes on the same kind of device. The directory is written atomically
    (:func:`lit_dof.io.atomic_directory`).

    Args:
        out_dir: the model directory to create (replaced if it exists).
        tokenizer_dir: a directory or hub id whose tokenizer is copied next to the model; its length must equal
            the config's ``vocab_size``.
        config_dir: a folder with the architecture's ``config.json`` (default: :data:`LLAMA_3_8B_TINY`).
        seed: seed of the random weights.
        dtype: ``"float32"`` or ``"bfloat16"`` (half the bytes: an 8B-parameter model is 16 GB).
        device: where the weights are drawn (``"cuda"`` draws an 8B model in seconds; the CPU takes minutes).
        pad_vocab: give a tokenizer shorter than ``vocab_size`` unreachable placeholder tokens up to it
            (:func:`pad_tokenizer_vocab`): text tokenises as before, and the embedding and logits keep the
            architecture's size.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.

    Raises:
        FileNotFoundError: ``config_dir`` has no ``config.json``.
        ValueError: the tokenizer's length differs from the config's ``vocab_size`` (token ids would index
            past the embedding, or rows would never be used) and ``pad_vocab`` is off or cannot make them equal;
            a ``dtype`` other than the two above.
    """
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lit_dof.io import atomic_directory

    config_file = Path(config_dir) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no architecture file {config_file}")
    config = AutoConfig.from_pretrained(config_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if len(tokenizer) != config.vocab_size and not (pad_vocab and len(tokenizer) < config.vocab_size):
        hint = "" if pad_vocab else " (or pass pad_vocab / --pad-vocab for a shorter tokenizer)"
        raise ValueError(
            f"the tokenizer of {tokenizer_dir} has {len(tokenizer)} tokens but {config_file} has "
            f"vocab_size {config.vocab_size}: they must be equal{hint}"
        )
    target = torch.device(device)
    with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []), target:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if len(tokenizer) < config.vocab_size:
            pad_tokenizer_vocab(tmp, config.vocab_size)
    return Path(out_dir)


def pad_tokenizer_vocab(model_dir: str | os.PathLike, vocab_size: int) -> int:
    """Add unreachable placeholder entries (``<|lit_dof_unused_i|>``) to the vocabulary of ``model_dir``'s
    ``tokenizer.json`` until it holds ``vocab_size`` tokens; no merge produces them, so every text tokenises as
    before. For rehearsing an architecture whose own tokenizer is out of reach (gated, offline).

    Args:
        model_dir: a folder with a fast tokenizer's ``tokenizer.json`` (BPE, WordPiece or WordLevel model).
        vocab_size: the length wanted.

    Returns:
        the number of entries added.

    Raises:
        ValueError: no ``tokenizer.json``, a model without a ``vocab`` mapping (Unigram), or a tokenizer already
            longer than ``vocab_size``.
    """
    from transformers import AutoTokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no tokenizer.json: only a fast tokenizer's vocabulary can be padded")
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec.get("model", {}).get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError(f"{path}: a {spec.get('model', {}).get('type')} model has no vocab mapping to pad")
    have = len(AutoTokenizer.from_pretrained(model_dir))
    if have > vocab_size:
        raise ValueError(f"the tokenizer of {model_dir} has {have} tokens, more than vocab_size {vocab_size}")
    taken = set(vocab.values()) | {int(t["id"]) for t in spec.get("added_tokens", [])}
    free = (i for i in range(vocab_size) if i not in taken)
    added = 0
    for index in free:
        if len(taken) + added >= vocab_size:
            break
        vocab[f"<|lit_dof_unused_{index}|>"] = index
        added += 1
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    got = len(AutoTokenizer.from_pretrained(model_dir))
    if got != vocab_size:
        raise ValueError(f"padding the tokenizer of {model_dir} gave {got} tokens, not vocab_size {vocab_size}")
    return added


def main(argv: list[str] | None = None) -> Path:
    """``python -m lit_dof.teacher.random_init OUT_DIR --tokenizer DIR [--config DIR] [--seed N]``."""
    parser = argparse.ArgumentParser(description=materialise_random_teacher.__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True, help="directory (or hub id) of a tokenizer of vocab_size tokens")
    parser.add_argument("--config", default=str(LLAMA_3_8B_TINY), help="folder with the architecture's config.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu", help="where the weights are drawn, e.g. cuda")
    parser.add_argument("--pad-vocab", action="store_true", help="pad a shorter tokenizer to the config's vocab_size")
    args = parser.parse_args(argv)
    out = materialise_random_teacher(
        args.out_dir,
        args.tokenizer,
        args.config,
        args.seed,
        dtype=args.dtype,
        device=args.device,
        pad_vocab=args.pad_vocab,
    )
    print(out)
    return out


if __name__ == "__main__":
    main()
