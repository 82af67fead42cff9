"""Checks that a saved student is whole before and after it loads (:func:`~lit_dof.students.load_student`).

Before: ``config.json`` is a JSON object with ``model_type`` and every safetensors file has an intact header that
covers the file (:mod:`lit_dof.model_files`). After: every floating-point parameter and buffer is finite (one
``aminmax`` reduction per tensor, one host sync per device) and a probe forward of :data:`PROBE_TOKENS` tokens
gives finite logits — overwritten tensor bytes load without complaint and only show up as NaN logits later.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from lit_dof.attention import FeatureMap
from lit_dof.model_files import check_config, check_weight_files

STUDENT_FIX = (
    "Re-export the student (student.save_pretrained(DIR) from the trained model, or rerun the run that exported "
    "it) or restore the folder from a copy."
)
"""The end of every error about a damaged student folder."""

PROBE_TOKENS = 8
"""Tokens of the probe forward that checks a loaded student's logits."""

MAX_NAMES = 10
"""Tensors named in a :class:`NonFiniteStudentError` (the count is always given)."""


class NonFiniteStudentError(ValueError):
    """A loaded student has NaN or infinite parameters, buffers or probe logits (the message names them)."""


def check_student_config(path: str | os.PathLike) -> dict:
    """Check a student folder's ``config.json`` (a JSON object with ``model_type``).

    Args:
        path: the student directory (it must hold ``config.json``).

    Returns:
        the configuration as a dict.

    Raises:
        CorruptModelFileError: invalid JSON (line and column given), not an object, or no ``model_type``; the
            message says to re-export the student.
    """
    return check_config(path, fix=STUDENT_FIX)


def check_student_weights(path: str | os.PathLike) -> None:
    """Check that every safetensors file of a student folder is whole (its header, not its tensors).

    Args:
        path: the student directory.

    Raises:
        CorruptModelFileError: a truncated or corrupt file; the message says to re-export the student.
    """
    check_weight_files(path, fix=STUDENT_FIX)


def nonfinite_tensors(model: nn.Module) -> tuple[list[str], int]:
    """The floating-point parameters and buffers of ``model`` that hold a NaN or an infinity.

    Args:
        model: any module; tensors on the ``meta`` device (offloaded) are skipped.

    Returns:
        ``(names, checked)``: the names of the non-finite tensors and how many tensors were checked.
    """
    named = [*model.named_parameters(), *model.named_buffers()]
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in named:
        if tensor.is_floating_point() and tensor.numel() and tensor.device.type != "meta":
            by_device.setdefault(tensor.device, []).append((name, tensor))
    bad = []
    for tensors in by_device.values():
        with torch.no_grad():
            finite = torch.stack([_finite(t) for _, t in tensors]).tolist()  # one host sync per device
        bad += [name for (name, _), ok in zip(tensors, finite) if not ok]
    return bad, sum(len(tensors) for tensors in by_device.values())


def _finite(tensor: torch.Tensor) -> torch.Tensor:
    """Whether every entry is finite, as a 0-d bool tensor: one ``aminmax`` reduction (NaN propagates to both
    ends; an infinity is one of them), exact, with no tensor-sized temporary — ``isfinite(t).all()`` builds a bool
    copy of the tensor and reduces it in a second pass."""
    low, high = torch.aminmax(tensor)
    return (low > float("-inf")) & (high < float("inf"))


def probe_logits(model: nn.Module, tokens: int = PROBE_TOKENS) -> torch.Tensor:
    """Logits of one short forward (token ids 1 … ``tokens``, modulo the vocabulary; no cache, no gradients).

    The feature maps' own NaN checks (``check_inputs``) are off during the probe, so a non-finite activation
    reaches the logits instead of raising in a feature map (or, on CUDA, tripping a device-side assert).

    Args:
        model: a causal LM whose ``config.get_text_config()`` has ``vocab_size``.
        tokens: the probe's length.

    Returns:
        the logits ``(1, tokens, V)``.
    """
    config = model.config.get_text_config(decoder=True)
    device = model.get_input_embeddings().weight.device
    ids = (torch.arange(1, tokens + 1, device=device) % config.vocab_size).unsqueeze(0)
    checking = [m for m in model.modules() if isinstance(m, FeatureMap) and m.check_inputs]
    try:
        for feature_map in checking:
            feature_map.check_inputs = False
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits
    finally:
        for feature_map in checking:
            feature_map.check_inputs = True


def check_finite(model: nn.Module, path: str | os.PathLike) -> None:
    """Refuse a loaded student with non-finite weights, or whose probe forward gives non-finite logits.

    Args:
        model: the loaded student.
        path: where it was loaded from (for the message).

    Raises:
        NonFiniteStudentError: names up to :data:`MAX_NAMES` non-finite tensors and their count, or says that the
            probe's logits are not finite; either way it says to re-export the student, or to pass
            ``check_finite=False`` to load it anyway for inspection.
    """
    anyway = "or pass check_finite=False to load_student to load it anyway for inspection."
    bad, checked = nonfinite_tensors(model)
    if bad:
        names = ", ".join(bad[:MAX_NAMES]) + (f", … ({len(bad) - MAX_NAMES} more)" if len(bad) > MAX_NAMES else "")
        raise NonFiniteStudentError(
            f"the student in {Path(path)} has NaN or infinite values in {len(bad)} of its {checked} floating-point "
            f"tensors: {names}. Its weights are damaged. {STUDENT_FIX[:-1]}, {anyway}"
        )
    logits = probe_logits(model)
    if not _finite(logits):
        dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
        raise NonFiniteStudentError(
            f"the student in {Path(path)} gives NaN or infinite logits on a {logits.shape[1]}-token probe although "
            f"its weights are finite (loaded as {dtype}): its weights or feature maps overflow. Load it in float32 "
            f"(dtype=torch.float32) if it was loaded in a half dtype; else {STUDENT_FIX[0].lower()}"
            f"{STUDENT_FIX[1:-1]}, {anyway}"
        )
