"""What a bank of linear twins (a student from ``lit-dof fit`` with ``configs/hybrid/twins.yaml``) says about
itself: that it is one (:func:`check_bank`), each layer's DoF (:func:`layer_dof`) and how it was trained
(:func:`bank_recipe`), read from the files the fit wrote next to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from lit_dof.dof.report import DoFReport
from lit_dof.pipeline.fit_config import FitConfig
from lit_dof.students.layer_losses import layer_loss_name


def check_bank(bank: str | os.PathLike) -> None:
    """Raise unless ``bank`` holds a saved student.

    Raises:
        FileNotFoundError: no ``config.json`` in ``bank`` (names the command that makes a bank).
    """
    if not (Path(bank) / "config.json").is_file():
        raise FileNotFoundError(
            f"no student at {bank}: run `lit-dof fit --config configs/base.yaml "
            "--config configs/hybrid/twins.yaml` and pass its version_*/student"
        )


def layer_dof(bank: Path, feature_dims: list[int]) -> tuple[dict[int, float], str]:
    """Per-layer DoF from the bank's ``dof.json`` (next to it or one folder up), else its feature dims."""
    for candidate in (bank / "dof.json", bank.parent / "dof.json"):
        if candidate.is_file():
            return {i: float(n) for i, n in enumerate(DoFReport.load(candidate).layer_dof)}, candidate.name
    return {i: float(m) for i, m in enumerate(feature_dims)}, "feature dims (no dof.json)"


def bank_recipe(bank: Path) -> str | None:
    """How the bank was trained, from the ``config.yaml`` that ``lit-dof fit`` saved one folder up (``None``
    when absent): loss, layer-wise steps and the end-to-end tail, e.g.
    ``"softmax loss, 400 steps, no end-to-end tail"``."""
    config = bank.parent / "config.yaml"
    if not config.is_file():
        return None
    saved = FitConfig.load(config)
    steps, tail = saved.trainer.max_steps, saved.model.init_args.finetune_fraction or 0.0
    parts = [f"{layer_loss_name(saved.model.init_args.loss)} loss"]
    if steps and steps > 0:
        parts.append(f"{steps} steps")
    parts.append(f"end-to-end tail {tail:.0%} of the steps" if tail else "no end-to-end tail")
    return ", ".join(parts)
