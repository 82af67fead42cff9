"""The teacher's architecture without its weights, for the memory plan (:mod:`lit_dof.pipeline.plan`) and the
checks run before the teacher loads (:mod:`lit_dof.pipeline.validation`).

:func:`resolve_teacher_config` finds the teacher's ``PretrainedConfig`` without weights or network (a local
directory's ``config.json``, the embedded alias's GGUF metadata or its cached conversion, or an architecture
file shipped in ``configs/models/<name>/config.json`` whose ``_name_or_path`` is the hub id);
:func:`architecture` builds the model on the meta device and reads its sizes (:class:`Architecture`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lit_dof.config_files import config_root

ARCHITECTURES_ENV = "LIT_DOF_ARCHITECTURES"
"""Environment variable: extra directory searched for ``<name>/config.json`` architecture files."""


class PlanError(ValueError):
    """The run cannot be planned (unknown teacher architecture, devices not a count, unsupported settings)."""


def _shipped_dirs() -> list[Path]:
    dirs = [Path(os.environ[ARCHITECTURES_ENV])] if os.environ.get(ARCHITECTURES_ENV) else []
    return dirs + [config_root() / "models"]


def shipped_architecture(hub_id: str) -> Path | None:
    """The shipped ``config.json`` of ``hub_id`` (``_name_or_path`` matches), or ``None``.

    Searches ``$LIT_DOF_ARCHITECTURES`` and the shipped ``configs/models/*/config.json``
    (:func:`lit_dof.config_files.config_root`).
    """
    for root in _shipped_dirs():
        for path in sorted(root.glob("*/config.json")):
            try:
                if json.loads(path.read_text()).get("_name_or_path") == hub_id:
                    return path
            except (OSError, json.JSONDecodeError):
                continue
    return None


def resolve_teacher_config(teacher: str):
    """The teacher's ``PretrainedConfig``, read without weights.

    Order: a local directory's ``config.json``; an embedded alias (its cached float32 conversion's config, else
    the GGUF file's metadata); a ``.gguf`` file's metadata; a shipped architecture file for a hub id; the local
    Hugging Face cache (or the hub, unless ``HF_HUB_OFFLINE=1``).

    Raises:
        PlanError: nothing describes ``teacher`` (the message lists where it looked).
    """
    from transformers import AutoConfig

    from lit_dof.teacher.loading import EMBEDDED_TEACHERS, embedded_gguf_path, gguf_cache_target

    path = Path(os.path.expanduser(teacher))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PlanError(f"{path} has no config.json: not a transformers model directory")
        return AutoConfig.from_pretrained(path)
    gguf = embedded_gguf_path(teacher) if teacher in EMBEDDED_TEACHERS else path if path.suffix == ".gguf" else None
    if gguf is not None:
        if not gguf.is_file():
            raise PlanError(f"GGUF file {gguf} does not exist")
        cached = gguf_cache_target(gguf)
        if (cached / "config.json").is_file():
            return AutoConfig.from_pretrained(cached)
        return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)  # metadata only
    shipped = shipped_architecture(teacher)
    if shipped is not None:
        return AutoConfig.from_pretrained(shipped.parent)
    try:
        return AutoConfig.from_pretrained(teacher)
    except OSError as exc:
        raise PlanError(
            f"no architecture for teacher {teacher!r}: not a local directory, alias or .gguf file, no "
            f"configs/models/*/config.json with _name_or_path {teacher!r} (or in ${ARCHITECTURES_ENV}), "
            "and not in the Hugging Face cache; ship its config.json there"
        ) from exc


@dataclass(frozen=True)
class Architecture:
    """Sizes of a teacher read from its meta-device model (counts of elements, not bytes).

    Attributes:
        params: all parameters (tied ones once). layer_params: the largest decoder layer's.
        root_params: parameters outside the decoder layers (embeddings, final norm, LM head).
        num_layers, hidden, intermediate, vocab: L, h, I, V. heads, kv_heads, head_dim: Hq, Hk, d.
        linear_layers: layers that get a linear twin (sliding-window layers stay softmax).
    """

    params: int
    layer_params: int
    root_params: int
    num_layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_layers: int


def architecture(config) -> Architecture:
    """Build the causal LM of ``config`` on the meta device (no memory, no weights) and measure it.

    Raises:
        UnsupportedModelError: no supported attention layers (:func:`~lit_dof.teacher.families.attention_layers`).
    """
    from lit_dof.teacher.families import attention_layers
    from lit_dof.teacher.sharded import empty_causal_lm

    model = empty_causal_lm(config)
    layers = attention_layers(model)
    classes = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in classes] or [layers[0].module]
    per_layer = [sum(p.numel() for p in block.parameters()) for block in blocks]
    params = sum(p.numel() for p in model.parameters())
    text = config.get_text_config(decoder=True)
    hidden = getattr(text, "hidden_size", None) or text.n_embd
    intermediate = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden
    first = layers[0]
    return Architecture(
        params=params,
        layer_params=max(per_layer),
        root_params=params - sum(per_layer),
        num_layers=len(layers),
        hidden=hidden,
        intermediate=intermediate,
        vocab=text.vocab_size,
        heads=first.num_heads,
        kv_heads=first.num_kv_heads,
        head_dim=first.head_dim,
        linear_layers=sum(layer.linearizable for layer in layers),
    )
