"""Per-task fine-tuning: training lowers the loss; the CLI phase records per-epoch accuracy with best/last
selection."""

from __future__ import annotations

import json

import pytest
import torch

from lit_dof.evaluation import task_data
from lit_dof.evaluation.finetune import TaskFinetuning
from lit_dof.evaluation.multiple_choice import collate_choices
from tests.conftest import REPO, TINYSTORIES

DATA = REPO.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


def _teacher():
    from lit_dof.teacher.loading import load_teacher

    return load_teacher(TINYSTORIES)


def test_training_lowers_the_choice_loss():
    module = TaskFinetuning(teacher=str(TINYSTORIES), trainable="all", lr=3e-3)
    module.configure_model()
    _, tokenizer = _teacher()
    batch = collate_choices(task_data.load_train_split("arc_easy", DATA)[:4], tokenizer, max_length=256)
    optimizer = torch.optim.Adam([p for p in module.model.parameters() if p.requires_grad], lr=3e-3)
    module.log = lambda *a, **k: None
    losses = []
    for _ in range(15):
        loss = module.training_step(batch, 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(ValueError, match="selects no parameter"):
        TaskFinetuning(teacher=str(TINYSTORIES), trainable="feature_maps").configure_model()  # a teacher has no φ


def test_finetune_phase_records_epochs(tmp_path):
    from lit_dof.pipeline.cli import build_cli

    cli = build_cli(["fit", "--config", str(REPO / "configs/finetune/arc_easy.yaml"),
                     f"--model.init_args.teacher={TINYSTORIES}", f"--data.init_args.data_dir={DATA}",
                     "--data.init_args.train_limit=8", "--data.init_args.eval_limit=6",
                     "--trainer.max_epochs=2", f"--trainer.logger.init_args.save_dir={tmp_path}",
                     "--trainer.enable_progress_bar=false",
                     "--model.init_args.selection=last"])  # fmt: skip  # packed args
    summary = json.loads((tmp_path / "finetune_arc_easy" / "version_0" / "finetune.json").read_text())
    assert [h["epoch"] for h in summary["history"]] == [0, 1] and all(h["examples"] == 6 for h in summary["history"])
    assert summary["score"] == summary["last"]["acc"]
    assert summary["best"]["acc"] == max(h["acc"] for h in summary["history"])
    assert cli.trainer.global_step == 4
    with pytest.raises(ValueError, match="no training split"):
        task_data.load_train_split("piqa", DATA)
