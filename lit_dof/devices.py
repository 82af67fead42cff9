"""Where a command's model runs and in which dtype: the ``--device`` / ``--dtype`` options of ``lit-dof eval``,
``hybrid``, ``generate`` and ``compare``, resolved in one place.

``--device``: ``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
``--dtype``: ``auto`` (the model's own: float32 for a teacher as :func:`~lit_dof.load_teacher` loads it, the
recorded ``config.dtype`` for an exported student), ``float32``, ``bfloat16`` or ``float16``; a student's
feature maps stay float32 whatever it is (:class:`~lit_dof.precision.Float32Parameters`).

Both are checked by :func:`resolve_device` / :func:`resolve_model_dtype` before any model loads; a bad value
raises :class:`DeviceError`, whose message names the options, and the commands turn it into a usage error.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

DEVICE_OPTIONS = "auto, cpu, cuda or cuda:N"
"""The accepted ``--device`` values, in words (error messages, help)."""

DTYPE_OPTIONS = ("auto", "float32", "bfloat16", "float16")
"""The accepted ``--dtype`` values (:data:`~lit_dof.precision.DtypeName`)."""


class DeviceError(ValueError):
    """A ``--device`` or ``--dtype`` that cannot be used: an unknown name, or CUDA where torch sees none."""


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The device a ``--device`` value names.

    Args:
        name: ``"auto"`` (``cuda`` when available, else ``cpu``), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``
            (or a ``torch.device``).

    Returns:
        the ``torch.device``.

    Raises:
        DeviceError: any other value, a CUDA device where torch sees none, or an index beyond the GPUs seen.
    """
    text = str(name).strip()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, colon, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (colon and not (kind == "cuda" and index.isdigit())):
        raise DeviceError(f"device {text!r}: use {DEVICE_OPTIONS}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {text!r} asked for, but torch sees no CUDA device: use --device cpu (or auto)")
        if colon and int(index) >= torch.cuda.device_count():
            raise DeviceError(
                f"device {text!r}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                f"cuda:0 … cuda:{torch.cuda.device_count() - 1}"
            )
    return torch.device(text)


def resolve_model_dtype(name: str | None = "auto") -> torch.dtype | None:
    """The parameter dtype a ``--dtype`` value names.

    Args:
        name: ``"auto"`` (or ``None``): the model's own dtype; else ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns:
        the ``torch.dtype``, or ``None`` for ``auto`` (load the model as it is).

    Raises:
        DeviceError: any other name.
    """
    from lit_dof.precision import DTYPES

    if name is None or name == "auto":
        return None
    if name not in DTYPES:
        raise DeviceError(f"dtype {name!r}: use {', '.join(DTYPE_OPTIONS)}")
    return DTYPES[name]


def device_label(device: str | torch.device) -> str:
    """A measurement's device in words: ``"cpu"`` or ``"cuda (NVIDIA H100 80GB HBM3)"`` (provenance keeps the
    CPU thread count apart, in ``cpu_threads``).

    Args:
        device: a device or its name.

    Returns:
        the label.
    """
    device = torch.device(device)
    return f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type


@contextlib.contextmanager
def device_errors_exit(prog: str) -> Iterator[None]:
    """Within the block, a :class:`DeviceError` ends the process as a usage error: ``PROG: error: MESSAGE`` on
    stderr and exit code 2, as argparse reports a bad option, instead of a traceback.

    Args:
        prog: the command's name, e.g. ``"lit-dof eval"``.

    Raises:
        SystemExit: code 2, on a :class:`DeviceError`.
    """
    try:
        yield
    except DeviceError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
