"""Runs that keep to themselves: checkpoints live in the run's own log directory (``<save_dir>/<name>/version_N/
checkpoints``, Lightning's default when a ``ModelCheckpoint`` has no ``dirpath``), ``--ckpt_path last``
continues the newest version that holds a checkpoint in that same directory (its TensorBoard curves and
``config.yaml`` go on where they stopped), and a checkpoint written by another experiment is refused.

    lit-dof fit --config configs/quickstart.yaml                   # runs/quickstart/version_0 (checkpoints inside)
    lit-dof fit --config configs/quickstart.yaml --ckpt_path last  # continues runs/quickstart/version_0

An experiment is what :func:`run_settings` collects: the model's and the data module's hyperparameters (their
class included), the feature-map factory and the planner's class and allocation settings
(:meth:`~lit_dof.pipeline.planner.FeatureDimPlanner.allocation_settings`). Settings that change nothing a
checkpoint holds (:data:`FREE_ON_RESUME`, and how a ``DoFPlanner`` makes its DoF report: a resumed run rebuilds the
checkpoint's feature dims from its ``dof.json`` via ``report_path``, and the module refuses other dims) may differ.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

LAST_CHECKPOINT = "last*.ckpt"
"""The ``ModelCheckpoint(save_last=True)`` files ``--ckpt_path last`` chooses from (``last.ckpt``, ``last-v1.ckpt``)."""

FREE_ON_RESUME = frozenset({"model._instantiator", "data._instantiator", "model.export_dir", "data.num_workers"})
"""Settings a resumed run may change: where the student is exported, how many loader workers tokenise."""


class ResumeMismatchError(ValueError):
    """``--ckpt_path`` names a checkpoint of another experiment (other model, data or allocation settings)."""


def checkpointed_version(root: str | os.PathLike) -> int | None:
    """The newest ``version_N`` under ``root`` (a logger's ``<save_dir>/<name>``) holding a last checkpoint.

    Args:
        root: the logger's run folder.

    Returns:
        N, or ``None`` when no version holds ``checkpoints/last*.ckpt``.
    """
    versions = [
        int(folder.name.removeprefix("version_"))
        for folder in Path(root).glob("version_*")
        if folder.name.removeprefix("version_").isdigit() and any((folder / "checkpoints").glob(LAST_CHECKPOINT))
    ]
    return max(versions, default=None)


def pin_logger_version(logger: Any) -> int | None:
    """Point a parsed logger (``trainer.logger``: ``class_path`` + ``init_args`` with ``save_dir``, ``name`` and
    ``version``, as TensorBoardLogger and CSVLogger have) at the newest version holding a checkpoint, so that
    ``--ckpt_path last`` resumes there and the run keeps logging into that version.

    Args:
        logger: the parsed ``trainer.logger`` value (a jsonargparse namespace); anything else is left alone.

    Returns:
        the version set, or ``None`` (another kind of logger, an explicit version, or nothing to resume).
    """
    init_args = getattr(logger, "init_args", None)
    if init_args is None or not hasattr(init_args, "save_dir") or getattr(init_args, "version", None) is not None:
        return None
    root = Path(init_args.save_dir or ".") / (getattr(init_args, "name", None) or "")
    version = checkpointed_version(root)
    if version is not None:
        init_args.version = version
    return version


def resumed_checkpoint(ckpt_path: str | None, trainer, resume_dir: str | None) -> Path | None:
    """The checkpoint a fit with ``ckpt_path`` will load: for ``"last"`` the newest last checkpoint of the
    trainer's ``ModelCheckpoint`` folders (a callback's ``dirpath``, else ``<resume_dir>/checkpoints``), as
    Lightning chooses it; else the path itself when it exists.

    Args:
        ckpt_path: the ``--ckpt_path`` value (``None``: no resume).
        trainer: the trainer about to fit.
        resume_dir: the version directory :func:`pin_logger_version` chose (``None``: none).

    Returns:
        the checkpoint, or ``None`` (nothing to resume, or ``best``/``hpc``/a registry name).
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    if ckpt_path != "last":
        return Path(ckpt_path) if ckpt_path and os.path.exists(ckpt_path) else None
    folders = [
        callback.dirpath or (resume_dir and os.path.join(resume_dir, "checkpoints"))
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint)
    ]
    found = [path for folder in folders if folder for path in Path(folder).glob(LAST_CHECKPOINT)]
    return max(found, key=lambda path: path.stat().st_mtime, default=None)


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds something other than tensors and plain data (a pickled object that loading would run)."""


class UnreadableCheckpointError(ValueError):
    """A checkpoint file is truncated or not a torch checkpoint at all."""


def checkpoint_metadata(path: str | os.PathLike) -> dict | None:
    """A checkpoint's dictionary without reading its tensors: a file memory-mapped, a sharded (DCP) folder's
    ``meta.pt``; ``None`` when there is none to read.

    Loaded with ``torch.load(weights_only=True)``: tensors, containers and primitive types only, so a planted
    file cannot run code (Lightning's own loads are ``weights_only`` too; lit-dof checkpoints hold nothing else).

    Args:
        path: a checkpoint file, or a sharded checkpoint's folder.

    Returns:
        the checkpoint's dictionary (tensors memory-mapped where the file allows), or ``None``.

    Raises:
        UnsafeCheckpointError: the file holds other objects (names the file and the object; none of it has run).
        UnreadableCheckpointError: the file is truncated or not a torch checkpoint.
    """
    import pickle

    import torch

    path = Path(path)
    if path.is_dir():
        path = path / "meta.pt"
        if not path.is_file():
            return None
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zip-format checkpoint: no mmap
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _torch_reason(exc)
        if "GLOBAL" not in found:  # no object named: damaged, or not a torch checkpoint
            raise _unreadable(path, exc) from exc
        raise UnsafeCheckpointError(
            f"{path} is not a checkpoint lit-dof loads: it holds objects other than tensors and plain data "
            f"(torch.load(weights_only=True): {found}). Nothing of it was run. A lit-dof checkpoint never holds "
            "such objects: delete this file (or pass another --ckpt_path); load it yourself only if you trust "
            "its source."
        ) from exc
    except Exception as exc:  # a damaged pickle fails in many ways (EOFError, KeyError, IndexError, struct.error, …)
        raise _unreadable(path, exc) from exc


_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")
"""The lines around the reason in ``torch.load(weights_only=True)``'s error (which also suggests the unsafe load)."""


def _torch_reason(exc: BaseException) -> str:
    """The line of a ``torch.load`` error that says what failed, without torch's advice to load unsafely."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith(_TORCH_BOILERPLATE)), type(exc).__name__)


def _unreadable(path: Path, exc: BaseException) -> UnreadableCheckpointError:
    reason = _torch_reason(exc)
    return UnreadableCheckpointError(
        f"{path} is not a readable checkpoint (truncated or damaged, or not a torch checkpoint: {reason}): delete "
        "it and resume from another checkpoint (--ckpt_path), or start afresh without --ckpt_path"
    )


def factory_name(factory: Any) -> str:
    """A stable description of a feature-map factory: a class's dotted name; for a partial (jsonargparse's
    ``class_path`` + ``init_args``, whose class is one of its positional arguments) that class's with the keywords."""
    if isinstance(factory, functools.partial):
        target = next((arg for arg in factory.args if isinstance(arg, type)), factory.func)
        keywords = ", ".join(f"{k}={v!r}" for k, v in sorted(factory.keywords.items()))
        return f"{factory_name(target)}({keywords})"
    if isinstance(factory, type) or callable(factory) and hasattr(factory, "__qualname__"):
        return f"{factory.__module__}.{factory.__qualname__}"
    return repr(factory)


def _plain(value: Any) -> Any:
    """``value`` with namespaces as dicts and tuples as lists, so a saved value compares equal to a parsed one."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def planner_settings(planner: Any) -> dict[str, Any]:
    """A feature-dimension planner's class (:func:`factory_name`) and allocation settings, as a checkpoint records
    them (``lit_dof_planner``).

    Args:
        planner: a :class:`~lit_dof.pipeline.planner.FeatureDimPlanner`.

    Returns:
        ``{"class": "lit_dof.pipeline.planner.DoFPlanner", "strategy": "dof", …}``.
    """
    return {"class": factory_name(type(planner)), **planner.allocation_settings()}


def run_settings(model: dict, data: dict | None, planner: dict | None, feature_map: str | None) -> dict[str, Any]:
    """The settings that make an experiment, flat: ``model.<key>``, ``data.<key>``, ``planner.<key>``.

    Args:
        model: the model's hyperparameters (``hparams``, or a checkpoint's ``hyper_parameters``).
        data: the data module's (``datamodule_hyper_parameters``); ``None``: none recorded.
        planner: the planner's :func:`planner_settings`; ``None``: none recorded.
        feature_map: the feature-map factory's :func:`factory_name`; ``None``: none recorded.

    Returns:
        ``{"model.lr_z": 0.02, …}``.
    """
    settings = {f"model.{k}": _plain(v) for k, v in (model or {}).items()}
    settings.update({f"data.{k}": _plain(v) for k, v in (data or {}).items()})
    settings.update({f"planner.{k}": _plain(v) for k, v in (planner or {}).items()})
    if feature_map is not None:
        settings["model.feature_map"] = feature_map
    return settings


LEGACY_ALLOCATOR = "FeatureDimAllocator"
"""The callback state key of the allocation settings in checkpoints written before the planners (the
``allocator:`` group: strategy, multiple_of, min_dim, budget — the keys of ``DoFPlanner``'s settings)."""


def saved_settings(checkpoint: dict) -> dict[str, Any]:
    """The :func:`run_settings` a checkpoint recorded (a checkpoint from before the planners: its allocator's
    settings, compared with a ``DoFPlanner``'s)."""
    planner = checkpoint.get("lit_dof_planner") or checkpoint.get("callbacks", {}).get(LEGACY_ALLOCATOR)
    return run_settings(
        checkpoint["hyper_parameters"],
        checkpoint.get("datamodule_hyper_parameters"),
        planner,
        checkpoint.get("lit_dof_feature_map"),
    )


def current_settings(model, datamodule) -> dict[str, Any]:
    """The :func:`run_settings` of the run about to fit."""
    feature_map, planner = getattr(model, "feature_map", None), getattr(model, "planner", None)
    return run_settings(
        dict(model.hparams),
        dict(datamodule.hparams) if datamodule is not None else None,
        planner_settings(planner) if planner is not None else None,
        factory_name(feature_map) if feature_map is not None else None,
    )


def setting_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The settings that differ between a checkpoint's :func:`run_settings` and the current run's, nested values
    compared key by key (``model.sliding_window.window``, not the whole group).

    Only keys recorded on both sides are compared (a setting added since the checkpoint was written is new, not
    different); :data:`FREE_ON_RESUME` may differ. A value that is a group on one side and not on the other (``lora``
    null in one, a LoRA config in the other) differs as a whole.

    Args:
        saved: the checkpoint's settings.
        current: the current run's.

    Returns:
        ``[(dotted key, saved value, current value)]``, sorted by key.
    """
    differ = []
    for key in sorted(saved.keys() & current.keys()):
        if key in FREE_ON_RESUME:
            continue
        a, b = saved[key], current[key]
        if isinstance(a, dict) and isinstance(b, dict):
            differ += setting_differences(*({f"{key}.{k}": v for k, v in side.items()} for side in (a, b)))
        elif a != b:
            differ.append((key, a, b))
    return differ


def check_resume(path: str | os.PathLike, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to resume (or evaluate) the checkpoint at ``path`` when its experiment differs from the current one
    (:func:`setting_differences`): a value given on the command line or in a config is never silently replaced
    by the checkpoint's, nor the checkpoint trained on under other settings.

    Args:
        path: the checkpoint (for the message).
        saved: its :func:`run_settings`.
        current: the current run's.

    Raises:
        ResumeMismatchError: some setting differs; the message names each (saved → now) and the fix.
    """
    differ = setting_differences(saved, current)
    if not differ:
        return
    changes = "; ".join(f"{key}: {a!r} in the checkpoint, {b!r} now" for key, a, b in differ)
    config = Path(path).resolve().parent.parent / "config.yaml"
    where = f" (its settings: {config})" if config.is_file() else ""
    raise ResumeMismatchError(
        f"{path} is a checkpoint of another experiment: {changes}. Resume it with its own settings{where}: drop "
        "these options or set them to the checkpoint's values; or start this experiment afresh without "
        "--ckpt_path (it gets a new version directory, checkpoints included)."
    )
