"""Check the files of a model folder (teacher or student) before transformers reads them.

transformers reports a damaged ``config.json`` as a missing tokenizer or a ``TypeError``, and a truncated weights
file as safetensors' bare ``incomplete metadata``, without the file or what to do. These checks read the config
(``json``, whose error carries the line and column) and open every safetensors file with safetensors' own
``safe_open`` — it parses the header and checks that the tensors cover the file exactly, without reading tensor
data — and raise :class:`CorruptModelFileError` naming the file, what is wrong, and the fix the caller passes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


class CorruptModelFileError(OSError):
    """A model file is damaged: ``config.json`` that is not a JSON object with ``model_type``, or a truncated or
    corrupt safetensors file. The message names the file, the problem and the fix."""


def _damaged(file: Path, problem: str, fix: str) -> CorruptModelFileError:
    return CorruptModelFileError(f"{file} {problem}. {fix}")


def read_json_object(file: str | os.PathLike, *, fix: str) -> dict:
    """Read a JSON file that must hold an object (``config.json``, a safetensors index).

    Args:
        file: the file (it must exist: a missing file raises ``FileNotFoundError`` as usual).
        fix: what the user should do, appended to the message.

    Returns:
        the object.

    Raises:
        CorruptModelFileError: not UTF-8 text, not valid JSON (the message gives the line and column), or JSON
            that is not an object.
    """
    file = Path(file)
    try:
        data = json.loads(file.read_bytes())
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): the file is damaged"
        raise _damaged(file, problem, fix) from exc
    except UnicodeDecodeError as exc:
        problem = f"is not valid JSON (not UTF-8 text at byte {exc.start}): the file is damaged"
        raise _damaged(file, problem, fix) from exc
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(type(data), "a number")
        raise _damaged(file, f"holds {kind}, not a JSON object: the file is damaged", fix)
    return data


def check_config(directory: str | os.PathLike, *, fix: str, name_fallback: bool = False) -> dict:
    """Read ``directory/config.json`` and check that it is a transformers configuration (it has ``model_type``).

    Args:
        directory: the model folder (it must hold ``config.json``).
        fix: what the user should do, appended to the message.
        name_fallback: accept a config without ``model_type`` when transformers recognises the model from the
            folder's name (``AutoConfig``'s fallback for old configs; teachers only).

    Returns:
        the configuration as a dict.

    Raises:
        CorruptModelFileError: as :func:`read_json_object`, or no ``model_type`` (and, with ``name_fallback``, a
            folder name transformers does not recognise either).
    """
    file = Path(directory) / "config.json"
    config = read_json_object(file, fix=fix)
    if "model_type" in config:
        return config
    problem = "has no model_type: it is not a transformers model configuration, or it is damaged"
    if not name_fallback:
        raise _damaged(file, problem, fix)
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(directory)
    except ValueError as exc:  # "Unrecognized model in ...": neither model_type nor a known name
        raise _damaged(file, problem, fix) from exc
    return config


def weight_files(directory: str | os.PathLike, *, fix: str) -> list[Path]:
    """The safetensors files of a model folder: the shards its index names, else ``model.safetensors``.

    Args:
        directory: the model folder.
        fix: what the user should do if the index is damaged.

    Returns:
        the files that exist (none for a folder with other weight formats).

    Raises:
        CorruptModelFileError: an index that is not a JSON object with a ``weight_map`` object.
    """
    directory = Path(directory)
    index = directory / WEIGHTS_INDEX_NAME
    if index.is_file():
        weight_map = read_json_object(index, fix=fix).get("weight_map")
        if not isinstance(weight_map, dict):
            raise _damaged(index, "has no weight_map object: the file is damaged", fix)
        return [directory / name for name in sorted(set(weight_map.values())) if (directory / name).is_file()]
    return [directory / WEIGHTS_NAME] if (directory / WEIGHTS_NAME).is_file() else []


def check_weight_files(directory: str | os.PathLike, *, fix: str) -> None:
    """Open each safetensors file of a model folder with ``safe_open`` (header and sizes only, no tensor data).

    Args:
        directory: the model folder.
        fix: what the user should do, appended to the message.

    Raises:
        CorruptModelFileError: a file that is truncated or corrupt (safetensors' own reason is quoted), or a
            damaged index.
    """
    from safetensors import SafetensorError, safe_open

    for file in weight_files(directory, fix=fix):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as exc:
            size = file.stat().st_size
            raise _damaged(file, f"is truncated or corrupt ({size} bytes; safetensors: {exc})", fix) from exc
