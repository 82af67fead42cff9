"""lit-dof's optional dependencies: which extra installs which package, and the error that names the extra.

The core install (``pip install lit-dof``) is what ``linearize``, ``load_student``, generation and the ``lit-dof``
command's own parsing need (torch, transformers, Lightning, jsonargparse, torchmetrics, safetensors); the rest
comes with an extra:

- ``train``: ``lit-dof fit`` (and validate / test / predict): streamed corpora (datasets), TensorBoard logs,
  the DoF figures (matplotlib), the LoRA tail (peft);
- ``eval``: zero-shot evaluation (lm-eval: ``lit-dof eval``, ``lit-dof lm-eval``, compare's task cells);
- ``plots``: figures outside ``fit`` (hybrid and comparison reports; matplotlib);
- ``gguf``: GGUF teachers, the embedded default among them (gguf, accelerate: transformers' dequantisation);
- ``gpu``: flash-linear-attention's Triton kernels.

A missing one raises :class:`MissingExtraError` (an ``ImportError``) whose message names
``pip install 'lit-dof[EXTRA]'``; the ``lit-dof`` command prints it in one line (:func:`lit_dof.cli.main`), and
does so too for a bare ``ModuleNotFoundError`` of a package listed here (:func:`missing_extra`).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

EXTRA_OF: dict[str, str] = {
    "datasets": "train",
    "tensorboard": "train",
    "peft": "train",
    "matplotlib": "plots",
    "lm_eval": "eval",
    "gguf": "gguf",
    "accelerate": "gguf",
    "fla": "gpu",
    "triton": "gpu",
}
"""Import name → the extra that installs it (matplotlib also comes with ``train``, for fit's figures)."""

TRAIN_MODULES = ("datasets", "tensorboard", "peft", "matplotlib")
"""What ``lit-dof fit`` (and validate / test / predict) needs beyond the core: the ``train`` extra."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra provides it."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'lit-dof[EXTRA]'``."""
    return f"pip install 'lit-dof[{extra}]'"


def missing_modules(modules: tuple[str, ...] | list[str]) -> list[str]:
    """The names among ``modules`` that cannot be imported (found by ``importlib.util.find_spec``, not imported)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def require(module: str, feature: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature``, or say which extra installs it.

    Args:
        module: the import name (``"peft"``, ``"matplotlib"``, ...).
        feature: what needs it, for the message (``"LoRA"``, ``"the hybrid report's figure"``).
        extra: the extra that installs it (default: :data:`EXTRA_OF`).

    Returns:
        the imported module.

    Raises:
        MissingExtraError: ``module`` is not installed; the message names ``feature``, the package and the extra.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there but one of its own dependencies is not: that is its own error
        extra = extra or EXTRA_OF[module.split(".")[0]]
        raise MissingExtraError(
            f"{feature} needs {module}, an optional dependency of lit-dof: {install_hint(extra)}"
        ) from exc


def require_all(modules: tuple[str, ...] | list[str], feature: str, extra: str) -> None:
    """Check that every one of ``modules`` is installed (nothing is imported).

    Raises:
        MissingExtraError: some are not; the message names them, ``feature`` and ``extra``.
    """
    missing = missing_modules(modules)
    if missing:
        raise MissingExtraError(
            f"{feature} needs {', '.join(missing)}, optional dependencies of lit-dof: {install_hint(extra)}"
        )


def missing_extra(exc: BaseException) -> MissingExtraError | None:
    """A :class:`MissingExtraError` for ``exc`` when it is a ``ModuleNotFoundError`` of a package that an extra
    installs (:data:`EXTRA_OF`), or Lightning's "Neither `tensorboard` nor `tensorboardX` is available"; else
    ``None``.
    """
    if not isinstance(exc, ImportError) or isinstance(exc, MissingExtraError):
        return None
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if name not in EXTRA_OF and "tensorboard" in str(exc) and isinstance(exc, ModuleNotFoundError):
        name = "tensorboard"
    if name not in EXTRA_OF:
        return None
    hint = install_hint(EXTRA_OF[name])
    return MissingExtraError(f"{name} is not installed, an optional dependency of lit-dof: {hint}")
