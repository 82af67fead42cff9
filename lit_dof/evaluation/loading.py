"""Loading a model to evaluate: an exported student directory or any teacher source, with its tokenizer."""

from __future__ import annotations

from pathlib import Path

from lit_dof.model_files import check_config

UNKNOWN_FOLDER_FIX = (
    "Restore the folder: re-export it if it is a lit-dof student (student.save_pretrained(DIR)), download it again "
    "if it is a teacher (hf download REPO_ID --local-dir DIR)."
)
"""The fix for a damaged ``config.json`` of a folder that may be a student or a teacher."""


def is_student(source: str) -> bool:
    """Whether ``source`` is an exported student (or hybrid) directory: a ``config.json`` with ``model_type: lit_dof``.

    Args:
        source: a path, alias or hub id.

    Returns:
        True for a student directory, False for anything else (a teacher source).

    Raises:
        CorruptModelFileError: a ``config.json`` that is not valid JSON, not an object, or without ``model_type``
            (unless transformers recognises the folder's name); the message names it and says to restore the folder.
    """
    if not (Path(source) / "config.json").is_file():
        return False
    return check_config(source, fix=UNKNOWN_FOLDER_FIX, name_fallback=True).get("model_type") == "lit_dof"


def load_model(source: str, device=None, dtype=None):
    """Load a model and its tokenizer from an exported student or a teacher source.

    Args:
        source: a student directory (``config.json`` with ``model_type: lit_dof``) or any teacher source accepted
            by :func:`lit_dof.load_teacher` (alias, directory, ``.gguf`` file, hub id).
        device: where the model goes (a ``torch.device`` or its name; default: CPU).
        dtype: the parameter dtype (a ``torch.dtype``); default: the model's own — float32 for a teacher, the
            recorded ``config.dtype`` for a student, whose feature maps stay float32 whatever it is.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        CorruptModelFileError: a damaged ``config.json`` or safetensors file (the message names it and the fix).
        NonFiniteStudentError: a student with NaN / infinite weights or probe logits.
        TeacherNotFoundError: as :func:`lit_dof.load_teacher`.
    """
    from lit_dof.teacher.loading import load_teacher, load_tokenizer

    if is_student(source):
        from lit_dof.students import load_student

        student = load_student(source, **({"dtype": dtype} if dtype is not None else {}))
        return (student.to(device) if device else student), load_tokenizer(source)
    if dtype is not None:
        return load_teacher(source, device=device, dtype=dtype)
    return load_teacher(source, device=device)
