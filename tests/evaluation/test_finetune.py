"""Per-task fine-tuning: training lowers the loss; the CLI phase records the untuned model and every epoch on the
choose and report splits, and reports the report split at the epoch chosen on the choose split."""

from __future__ import annotations

import json

import pytest
import torch

from lit_dof.evaluation.finetune import TaskFinetuning
from lit_dof.evaluation.finetune_splits import protocol_splits
from lit_dof.evaluation.multiple_choice import collate_choices, option_scores, score_matrix
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
    batch = collate_choices(protocol_splits("arc_easy", DATA).train[:4], tokenizer, max_length=256)
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
                     "--data.init_args.task=piqa", "--data.init_args.train_limit=8",
                     "--data.init_args.choose_limit=6", "--data.init_args.report_limit=5",
                     "--trainer.max_epochs=2", f"--trainer.logger.init_args.save_dir={tmp_path}",
                     "--trainer.enable_progress_bar=false"])  # fmt: skip  # packed args
    summary = json.loads((tmp_path / "finetune_arc_easy" / "version_0" / "finetune.json").read_text())
    assert [h["epoch"] for h in summary["history"]] == [0, 1] and cli.trainer.global_step == 4
    assert all((h["choose"]["examples"], h["report"]["examples"]) == (6, 5) for h in summary["history"])
    chosen = max(summary["history"], key=lambda h: (h["choose"]["acc"], -h["epoch"]))
    assert summary["chosen"] == chosen and summary["score"] == chosen["report"]["acc"]
    # the untuned model (the full sanity check) against an independent count of its right answers
    model, tokenizer = _teacher()
    docs = protocol_splits("piqa", DATA).report[:5]
    batch = collate_choices(docs, tokenizer, max_length=512)
    with torch.no_grad():
        right = score_matrix(option_scores(model.eval(), batch), batch).argmax(-1) == batch["gold"]
    assert summary["before"]["report"]["examples"] == 5
    assert summary["zero_shot"] == pytest.approx(float(right.sum()) / 5)
    assert summary["before"]["report"]["correct"] == "".join(str(int(r)) for r in right)
    assert all(len(h["choose"]["correct"]) == 6 for h in summary["history"])


def test_the_epoch_is_chosen_on_the_choose_split_never_the_report_split():
    module = TaskFinetuning(teacher=str(TINYSTORIES))
    split = lambda acc: {"acc": acc, "acc_norm": acc, "examples": 10}  # noqa: E731
    module.history = [
        {"epoch": 0, "step": 5, "choose": split(0.6), "report": split(0.9)},
        {"epoch": 1, "step": 10, "choose": split(0.7), "report": split(0.5)},
        {"epoch": 2, "step": 15, "choose": split(0.7), "report": split(0.4)},
    ]
    module.before = {"choose": split(0.3), "report": split(0.2)}
    summary = module.summary()
    assert summary["chosen"]["epoch"] == 1 and summary["score"] == 0.5 and summary["choose_score"] == 0.7
    assert summary["zero_shot"] == 0.2
    module.selection = "last"
    assert module.summary()["score"] == 0.4


def test_a_resumed_fit_keeps_the_epochs_measured_before_it():
    module = TaskFinetuning(teacher=str(TINYSTORIES))
    module.history, module.before = [{"epoch": 0, "step": 5}], {"choose": {"acc": 0.3}}
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    resumed = TaskFinetuning(teacher=str(TINYSTORIES))
    resumed.on_load_checkpoint(checkpoint)
    assert (resumed.history, resumed.before) == (module.history, module.before)
