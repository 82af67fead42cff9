"""Loading a model to evaluate: an exported student directory or any teacher source, with its tokenizer."""

from __future__ import annotations

import json
from pathlib import Path


def load_model(source: str, device: str | None = None):
    """Load a model and its tokenizer from an exported student or a teacher source.

    Args:
        source: a student directory (``config.json`` with ``model_type: lit_dof``) or any teacher source accepted
            by :func:`lit_dof.load_teacher` (alias, directory, ``.gguf`` file, hub id).
        device: where the model goes (default: CPU).

    Returns:
        ``(model, tokenizer)``.
    """
    from lit_dof.teacher.loading import load_teacher, load_tokenizer

    config = Path(source) / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("model_type") == "lit_dof":
        from lit_dof.students import load_student

        student = load_student(source)
        return (student.to(device) if device else student), load_tokenizer(source)
    return load_teacher(source, device=device)
