"""Pipeline fixtures: the real TinyStories-656K teacher and the local Wikipedia corpus, tiny budgets."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, TINYSTORIES, WIKIPEDIA

TINY_ARGS = [
    f"--model.init_args.teacher={TINYSTORIES}",
    f"--data.init_args.path={WIKIPEDIA}",
    "--data.init_args.seq_len=64",
    "--data.init_args.batch_size=2",
    "--data.init_args.val_blocks=2",
    "--model.init_args.query_rows=32",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.log_every_n_steps=1",
]


BASE = REPO / "configs" / "base.yaml"
"""The shared setup every recipe composes over: alone, pure linear attention (learned PRF, DoF dims), no LoRA."""

TINY_DOF = REPO / "tests" / "pipeline" / "tiny_dof.yaml"
"""Composed after :data:`BASE` by :func:`fit_args`: a DoF estimate of 64 samples per head from 2 batches."""

SCHEDULE = REPO / "tests" / "pipeline" / "schedule.yaml"
"""Composed after :data:`TINY_DOF` by :func:`fit_args`: every batch captured, the last 30% of the steps end to end."""


def fit_args(tmp_path, *configs: str, steps: int = 3, extra=()) -> list[str]:
    """``lit-dof fit`` arguments: the base config (:data:`BASE`, pure linear) with a tiny DoF
    estimate (:data:`TINY_DOF`) and the tests' schedule (:data:`SCHEDULE`), extra config files, tiny budgets,
    logs in tmp_path."""
    args = ["fit", "--config", str(BASE)]
    args += ["--config", str(TINY_DOF), "--config", str(SCHEDULE)]
    for config in configs:
        args += ["--config", str(REPO / "configs" / config)]
    return (
        args
        + TINY_ARGS
        + [
            f"--trainer.max_steps={steps}",
            f"--trainer.val_check_interval={steps}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            *extra,
        ]
    )


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path
