"""The request cache of an evaluation (``lit-dof eval --cache_dir``, compare's task cells): lm-eval's own
``CachingLM`` (``use_cache``: a SQLite file per rank, ``<prefix>_rank<r>.db``, written as requests are answered), so
that a killed evaluation resumes where it stopped — made safe to reuse.

* lm-eval keys answers by request text alone: :func:`request_cache` binds the folder to one model (a digest of its
  weights, :func:`weights_digest`) and its settings, and refuses any other.
* lm-eval stores each answer pickled (``sqlitedict``'s default codec) and unpickles it when it reads the cache back,
  so a planted or altered cache file could run code: :func:`check_cache_files` reads every stored answer first with an
  unpickler that resolves no global (no class, no function: only the plain values an answer is — floats, booleans,
  strings, tuples, lists) and refuses the file otherwise, before lm-eval opens it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
from pathlib import Path

import torch

from lit_dof.io import atomic_write_json


class UnsafeRequestCacheError(ValueError):
    """A request-cache file holds something other than plain answers (a pickled object that reading would run)."""


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain values only: any global (a class or function, the means of every pickle payload) is refused,
    and so is a persistent id."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"global {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"persistent id {pid!r}")


def plain_loads(data: bytes):
    """Unpickle ``data`` when it holds plain values only (no global is ever resolved, so nothing can run).

    Args:
        data: a pickle.

    Returns:
        the value.

    Raises:
        pickle.UnpicklingError: the pickle names a global or a persistent id.
    """
    return _PlainUnpickler(io.BytesIO(bytes(data))).load()


def check_cache_files(prefix: str | os.PathLike) -> int:
    """Read every answer of the cache files ``<prefix>_rank*.db`` with :func:`plain_loads` (lm-eval would unpickle
    them unrestricted) and refuse a file that holds anything else.

    Args:
        prefix: the path prefix lm-eval appends ``_rank<r>.db`` to.

    Returns:
        the number of answers checked.

    Raises:
        UnsafeRequestCacheError: a file holds a pickled object or is not a readable cache (names the file, the
            offending entry and the fix; nothing of it ran).
    """
    from sqlitedict import SqliteDict

    prefix = Path(prefix)
    checked = 0
    for path in sorted(prefix.parent.glob(f"{prefix.name}_rank*.db")):
        try:
            with SqliteDict(str(path), flag="r", decode=plain_loads) as answers:
                for _ in answers.values():
                    checked += 1
        except Exception as exc:  # an object named in a pickle, a damaged pickle, a file that is not SQLite
            raise UnsafeRequestCacheError(
                f"request cache file {path} holds something other than plain answers ({type(exc).__name__}: "
                f"{exc}); nothing of it was run. lit-dof never writes such entries: delete the file (its answers "
                "are recomputed) or pass another cache folder"
            ) from exc
    return checked


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's parameters and buffers (names, dtypes, shapes and bytes), in ``state_dict`` order:
    equal exactly when two models compute with the same numbers."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{data.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def request_cache(cache_dir: str | os.PathLike, model: torch.nn.Module, **settings) -> str:
    """Bind ``cache_dir`` to ``model`` and return the path prefix for lm-eval's ``use_cache``.

    lm-eval's request cache (``CachingLM``, ``<prefix>_rank<r>.db``) keys each answer by the request's text
    alone, so answers of one model would be served to another. The folder's ``model.json`` records the weights'
    digest (:func:`weights_digest`) and ``settings`` (batch size, context length: results depend on them only
    through floating-point order) on first use; later uses must match.

    Args:
        cache_dir: the folder (created if missing).
        model: the model whose answers the folder keeps.
        **settings: other values the answers depend on (JSON-serialisable).

    Returns:
        ``<cache_dir>/requests``, the prefix lm-eval appends ``_rank<r>.db`` to.

    Raises:
        ValueError: the folder was written for other weights or settings (the message names both and the fix).
        UnsafeRequestCacheError: a cache file holds anything but plain answers (:func:`check_cache_files`).
    """
    folder = Path(cache_dir)
    stamp = {"weights_sha256": weights_digest(model), **settings}
    record = folder / "model.json"
    if record.is_file():
        kept = json.loads(record.read_text())
        if kept != stamp:
            changed = sorted(k for k in stamp.keys() | kept.keys() if stamp.get(k) != kept.get(k))
            raise ValueError(
                f"request cache {folder} holds answers of another model or setting ({', '.join(changed)} differ: "
                f"{ {k: kept.get(k) for k in changed} } there, { {k: stamp.get(k) for k in changed} } now); "
                "pass another cache folder or delete this one"
            )
    else:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(record, stamp)
    prefix = folder / "requests"
    check_cache_files(prefix)
    return str(prefix)
