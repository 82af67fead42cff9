"""Typed records read from and written to JSON: :func:`parse_record`, :func:`load_record` and :func:`dump_record`
turn JSON-ready containers into dataclasses and back through pydantic (a :class:`pydantic.TypeAdapter` per type):
every field is validated, and a record read from disk builds nothing but the types it declares — no pickle, no
class named by the data. :func:`save_record` writes one atomically.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter

from lit_dof.io import atomic_write_json

T = TypeVar("T")


@cache
def adapter(kind: Any) -> TypeAdapter:
    """pydantic's parser and dumper of ``kind`` (a dataclass, or a type such as ``list[X]``; one per type, made on
    first use)."""
    return TypeAdapter(kind)


def parse_record(kind: type[T], data: Any) -> T:
    """``data`` (JSON-ready containers) as a ``kind`` record, validated field by field (keys it does not declare are
    ignored).

    Raises:
        pydantic.ValidationError (a ``ValueError``): a field of the wrong type, or a required one missing (named).
    """
    return adapter(kind).validate_python(data)


def load_record(kind: type[T], path: str | os.PathLike) -> T | None:
    """The ``kind`` record in the JSON file ``path``; ``None`` when there is no such file.

    Raises:
        ValueError: not JSON, or not a ``kind`` record (pydantic names the field).
    """
    path = Path(path)
    return adapter(kind).validate_json(path.read_bytes()) if path.is_file() else None


def dump_record(record: Any, kind: Any = None) -> Any:
    """``record`` as JSON-ready containers (integer keys as strings), fields in declaration order.

    Args:
        record: a record (or a container of records).
        kind: its type (default: ``type(record)``; pass e.g. ``list[X]`` for a container).
    """
    return adapter(kind or type(record)).dump_python(record, mode="json")


def save_record(path: str | os.PathLike, record: Any, kind: Any = None) -> None:
    """Write ``record`` (:func:`dump_record`) to ``path`` as JSON, atomically."""
    atomic_write_json(path, dump_record(record, kind))
