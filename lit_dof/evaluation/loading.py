"""Loading a model to evaluate: an exported student directory or any teacher source, with its tokenizer."""

from __future__ import annotations

import json
from pathlib import Path


def is_student(source: str) -> bool:
    """Whether ``source`` is an exported student (or hybrid) directory: a ``config.json`` with ``model_type: lit_dof``.

    Args:
        source: a path, alias or hub id.

    Returns:
        True for a student directory, False for anything else (a teacher source).
    """
    config = Path(source) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == "lit_dof"


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
    """
    from lit_dof.teacher.loading import load_teacher, load_tokenizer

    if is_student(source):
        from lit_dof.students import load_student

        student = load_student(source, **({"dtype": dtype} if dtype is not None else {}))
        return (student.to(device) if device else student), load_tokenizer(source)
    if dtype is not None:
        return load_teacher(source, device=device, dtype=dtype)
    return load_teacher(source, device=device)
