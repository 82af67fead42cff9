"""Random-initialised teachers built from an architecture file: rehearse a recipe's shapes without its weights.

A rehearsal runs the real recipe (configs, strategy, precision, launch) on a model of the same family, layer
count and head layout as the target but with shrunk widths, so that every per-layer and per-head code path
(DoF estimate, allocation, sharding at the decoder layer, GQA grouping, export) is exercised in minutes on
a CPU. The shipped tiny config :data:`LLAMA_3_8B_TINY` (``configs/models/llama-3-8b-tiny/config.json``) is
Llama-3-8B's 32 layers, 32 query heads and 8 KV heads (GQA 4:1, untied embeddings, RoPE θ 5·10⁵) at
hidden size 256 (head size 8), MLP width 512 and the 2048-token vocabulary of TinyStories-656K's tokenizer.
No weights are shipped: :func:`materialise_random_teacher` writes a model directory ``load_teacher`` accepts.

    python -m lit_dof.teacher.random_init OUT_DIR --tokenizer ../shared/models/TinyStories-656K
"""

from __future__ import annotations

import argparse
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
) -> Path:
    """Write a random-initialised causal LM (float32 safetensors, ``save_pretrained``) and a tokenizer to ``out_dir``.

    The weights are drawn with the family's own initialiser (``initializer_range`` of the config) from
    ``seed``, inside a forked RNG (the caller's global RNG is untouched), so the same arguments give the same
    bytes. The directory is written atomically (:func:`lit_dof.io.atomic_directory`).

    Args:
        out_dir: the model directory to create (replaced if it exists).
        tokenizer_dir: a directory or hub id whose tokenizer is copied next to the model; its length must equal
            the config's ``vocab_size``.
        config_dir: a folder with the architecture's ``config.json`` (default: :data:`LLAMA_3_8B_TINY`).
        seed: seed of the random weights.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.

    Raises:
        FileNotFoundError: ``config_dir`` has no ``config.json``.
        ValueError: the tokenizer's length differs from the config's ``vocab_size`` (token ids would index
            past the embedding, or rows would never be used).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lit_dof.io import atomic_directory

    config_file = Path(config_dir) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no architecture file {config_file}")
    config = AutoConfig.from_pretrained(config_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if len(tokenizer) != config.vocab_size:
        raise ValueError(
            f"the tokenizer of {tokenizer_dir} has {len(tokenizer)} tokens but {config_file} has "
            f"vocab_size {config.vocab_size}: they must be equal"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> Path:
    """``python -m lit_dof.teacher.random_init OUT_DIR --tokenizer DIR [--config DIR] [--seed N]``."""
    parser = argparse.ArgumentParser(description=materialise_random_teacher.__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True, help="directory (or hub id) of a tokenizer of vocab_size tokens")
    parser.add_argument("--config", default=str(LLAMA_3_8B_TINY), help="folder with the architecture's config.json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = materialise_random_teacher(args.out_dir, args.tokenizer, args.config, args.seed)
    print(out)
    return out


if __name__ == "__main__":
    main()
