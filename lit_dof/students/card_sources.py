"""What a student's model card says, read from its folder and from what its teacher's files say.

* Records in the student folder: a DoF report (:func:`find_dof_report`), measurements (:func:`find_results`) and
  the fit's training record (:data:`TRAINING_FILE`, :func:`read_training`, written by ``lit-dof fit`` at export).
* The teacher (``config.json``'s ``teacher``: the source the user gave): its hub id and license
  (:func:`teacher_source`), never a local path as the hub id.
* The decode state per sequence (:func:`decode_state`), counted from ``config.json`` alone (the student's modules
  built on the meta device, no weights read).

Records whose keys differ are read where they can be and skipped where they cannot.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from lit_dof.attention.feature_maps.base import FeatureMap

RESULT_METRICS = ("acc_norm", "acc")
"""Task metrics shown, in order of preference (lm-eval's usual headline: acc_norm where defined)."""

TRAINING_FILE = "lit_dof_training.json"
"""The fit's training record in a student folder (recipe, steps, tokens, data, LoRA, validation perplexities)."""

_NOT_RESULTS = {
    "config.json",
    "generation_config.json",
    "dof.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "model.safetensors.index.json",
    TRAINING_FILE,
}
_MAX_RECORD_BYTES = 20 * 2**20
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HUB_CACHE_FOLDER = re.compile(r"^models--([A-Za-z0-9][A-Za-z0-9._-]*)--([A-Za-z0-9][A-Za-z0-9._-]*)$")


def read_json(path: Path) -> dict | None:
    """``path`` parsed as a JSON object, or ``None`` (missing, over 20 MiB, unreadable or not an object)."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_RECORD_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def first(record: dict, keys) -> object:
    """The value of the first of ``keys`` that ``record`` holds (not ``None``), else ``None``."""
    return next((record[k] for k in keys if record.get(k) is not None), None)


def number(value) -> float | None:
    """``value`` as a float if it is an int or float (not a bool), else ``None``."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def find_dof_report(directory: str | os.PathLike, feature_dims: list) -> dict | None:
    """The DoF report describing the student in ``directory``.

    Args:
        directory: the student directory.
        feature_dims: the student's feature dims (``config.json``).

    Returns:
        ``directory/dof.json``; else ``dof.json`` one folder up if one of its ``allocations`` equals
        ``feature_dims`` (so a report about another model is not shown); else ``None``.
    """
    directory = Path(directory)
    own = read_json(directory / "dof.json")
    if own is not None:
        return own
    parent = read_json(directory.parent / "dof.json")
    allocations = (parent or {}).get("allocations")
    if isinstance(allocations, dict) and feature_dims in allocations.values():
        return parent
    return None


def find_results(directory: str | os.PathLike) -> tuple[list[tuple[str, float, object]], dict[str, tuple]]:
    """Measurements recorded in ``directory``.

    Args:
        directory: the student directory.

    Returns:
        ``(perplexities, tasks)``: ``[(record name, ppl, tokens or None)]`` from JSON records with a numeric
        ``ppl``, and ``{task: (metric, value, stderr or None, n or None)}`` from records with ``tasks`` (``lit-dof
        eval --output``) and from ``eval/<task>.json``; unreadable or unrecognised records are skipped.
    """
    directory = Path(directory)
    perplexities, tasks = [], {}
    records = [(p.stem, read_json(p)) for p in sorted(directory.glob("*.json")) if p.name not in _NOT_RESULTS]
    for name, record in records:
        if record is None:
            continue
        ppl = number(record.get("ppl"))
        if ppl is not None:
            perplexities.append((name, ppl, record.get("tokens")))
        if isinstance(record.get("tasks"), dict):
            for task, entry in record["tasks"].items():
                _add_task(tasks, str(task), entry)
    for path in sorted(directory.glob("eval/*.json")):
        _add_task(tasks, path.stem, read_json(path))
    return perplexities, tasks


def _add_task(tasks: dict, task: str, entry) -> None:
    if not isinstance(entry, dict):
        return
    metric = next((m for m in RESULT_METRICS if number(entry.get(m)) is not None), None)
    if metric is not None:
        tasks[task] = (metric, float(entry[metric]), number(entry.get(f"{metric}_stderr")), entry.get("n"))


def read_training(directory: str | os.PathLike) -> dict | None:
    """The fit's training record in ``directory`` (:data:`TRAINING_FILE`), or ``None`` (a student not exported
    by ``lit-dof fit``, or an unreadable record)."""
    return read_json(Path(directory) / TRAINING_FILE)


@dataclass(frozen=True)
class TeacherSource:
    """Where a student's teacher came from, for the card.

    Attributes:
        label: how the card names it (markdown): the hub id, an alias with its hub id, or a local folder's or
            file's name.
        hub_id: the Hugging Face hub id (the card's ``base_model``), or ``None`` where unknown.
        license: the teacher's license id (e.g. ``apache-2.0``), or ``None`` where unknown.
    """

    label: str | None
    hub_id: str | None
    license: str | None


def _front_matter_license(readme: Path | str | None) -> str | None:
    """The ``license`` of a model card's YAML front matter, or ``None``."""
    if not isinstance(readme, (str, Path)) or not Path(readme).is_file():
        return None
    from huggingface_hub import metadata_load

    try:
        value = (metadata_load(readme) or {}).get("license")
    except (OSError, ValueError, UnicodeDecodeError):  # a damaged card: no license claimed
        return None
    return value if isinstance(value, str) and value else None


def _cached_hub_license(hub_id: str) -> str | None:
    """The license in the hub model's card if it is in the local Hugging Face cache (never the network)."""
    from huggingface_hub import try_to_load_from_cache

    return _front_matter_license(try_to_load_from_cache(hub_id, "README.md"))


def _local_hub_id(folder: Path) -> str | None:
    """The hub id of a local teacher folder: a Hugging Face cache snapshot (``models--org--name/snapshots/…``), or
    a ``config.json`` whose ``_name_or_path`` is a hub id; else ``None``."""
    parts = folder.resolve().parts
    match = _HUB_CACHE_FOLDER.match(parts[-3]) if len(parts) >= 3 and parts[-2] == "snapshots" else None
    if match:
        return f"{match.group(1)}/{match.group(2)}"
    name = (read_json(folder / "config.json") or {}).get("_name_or_path")
    return name if isinstance(name, str) and is_hub_id(name) and not Path(name).exists() else None


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the form of a Hugging Face model id (``org/name``).

    Args:
        name: a teacher source.

    Returns:
        ``True`` for ``org/name`` (letters, digits, ``.``, ``_``, ``-``; no ``--`` or ``..``).
    """
    return bool(_HUB_ID.match(name)) and "--" not in name and ".." not in name


def teacher_source(teacher: str | None) -> TeacherSource:
    """The hub id and license of a student's teacher, as far as local files tell.

    Args:
        teacher: ``config.json``'s ``teacher``: an embedded alias, a local folder, a ``.gguf`` file or a hub id.

    Returns:
        An alias: its :data:`~lit_dof.teacher.EMBEDDED_HUB_SOURCES` entry. A local folder: the hub id of a
        Hugging Face cache snapshot or of its ``config.json``'s ``_name_or_path``, the license of its ``README.md``.
        A hub id (not an existing path): itself, the license of its card if cached. A ``.gguf`` file or anything
        else: no hub id and no license. A local path is never returned as the hub id.
    """
    from lit_dof.teacher import EMBEDDED_HUB_SOURCES

    if not teacher:
        return TeacherSource(None, None, None)
    if teacher in EMBEDDED_HUB_SOURCES:
        hub_id, license_id = EMBEDDED_HUB_SOURCES[teacher]
        return TeacherSource(f"`{hub_id}` (lit-dof's embedded `{teacher}`)", hub_id, license_id)
    path = Path(os.path.expanduser(teacher))
    if path.is_dir():
        hub_id = _local_hub_id(path)
        license_id = _front_matter_license(path / "README.md") or (_cached_hub_license(hub_id) if hub_id else None)
        return TeacherSource(
            f"`{hub_id}`" if hub_id else f"`{path.resolve().name}` (a local folder)", hub_id, license_id
        )
    if is_hub_id(teacher) and not path.exists():
        return TeacherSource(f"`{teacher}`", teacher, _cached_hub_license(teacher))
    return TeacherSource(f"`{path.name}`" + (" (a local file)" if path.is_file() else ""), None, None)


STATE_CONTEXTS = (1_024, 8_192, 32_768)
"""Contexts (tokens) at which the card counts the decode state, those within the teacher's positions (at least one)."""


@dataclass(frozen=True)
class DecodeState:
    """A student's generation cache per sequence beside its teacher's (bytes;
    lit_dof.students.state_bytes.closed_form_state_bytes).

    Attributes:
        rows: ``(context in tokens, the student's state, the teacher's KV cache)`` at each counted context.
        full_context: the context from which the student's state is full (its windows and sinks filled).
        constant: whether the state stays the same from ``full_context`` on (no layer keeps a growing KV cache).
    """

    rows: tuple[tuple[int, int, int], ...]
    full_context: int
    constant: bool


def decode_state(config: dict) -> DecodeState | None:
    """The decode state of the student ``config`` describes, counted on its modules built on the meta device.

    The twins get a map that has the recorded sizes (heads H, features M) and nothing else: the count reads only
    those, and building the real maps would draw their random features (seconds per layer for an 8B teacher).
    Keys and values count in the recorded ``dtype`` (``config.json``'s), the linear state in float32. Contexts:
    :data:`STATE_CONTEXTS` up to the teacher's ``max_position_embeddings`` (that alone when it is smaller).

    Args:
        config: the student's ``config.json``.

    Returns:
        the counts, or ``None`` where ``config`` does not describe a model (no or a damaged ``text_config``, an
        unsupported family).
    """
    import torch

    from lit_dof.students.config import LitDofConfig
    from lit_dof.students.modeling import LitDofForCausalLM
    from lit_dof.students.state_bytes import closed_form_state_bytes, full_state_context

    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    try:
        with torch.device("meta"):
            model = LitDofForCausalLM(LitDofConfig.from_dict(config), feature_map_factory=_SizesOnly)
    except (ValueError, KeyError):  # no text_config, one without a known model_type, an unsupported family
        return None
    positions = getattr(model.config.text_config, "max_position_embeddings", None) or STATE_CONTEXTS[-1]
    contexts = [t for t in STATE_CONTEXTS if t <= positions] or [positions]
    full = full_state_context(model)
    student = [closed_form_state_bytes(model, t, dtype=dtype) for t in (*contexts, full)]
    with model.teacher_mode():  # every layer softmax: the teacher's own KV cache
        teacher = [closed_form_state_bytes(model, t, dtype=dtype) for t in contexts]
    rows = tuple(zip(contexts, student, teacher))
    return DecodeState(rows, full, constant=all(b == student[-1] for b in student[:-1]))


class _SizesOnly(FeatureMap):
    """A feature map's sizes (head size d, heads H, features M) and nothing else: what the decode-state count reads."""

    def _log_features(self, x, drop_row_constant: bool):
        raise NotImplementedError("a map of sizes only: it counts the decode state, it computes no features")

    def _resize(self, feature_dim: int) -> None:
        raise NotImplementedError("a map of sizes only: it is never resized")
