"""The paper's evaluation protocol (METHOD.md §4) as a Lightning phase: per-task fine-tuning of a teacher or
a student on a multiple-choice task, validated by accuracy every epoch.

Every example is scored the way zero-shot evaluation scores it (:mod:`lit_dof.evaluation.multiple_choice`; the data:
:class:`~lit_dof.evaluation.finetune_data.MultipleChoiceDataModule`). Training minimises the cross-entropy of the gold
option under the softmax over the option scores; validation measures ``acc`` (argmax of the scores) and ``acc_norm``
(argmax of score / continuation length in characters, as lm-eval) on two disjoint splits
(:mod:`lit_dof.evaluation.finetune_splits`): ``choose`` and ``report``. The paper fine-tunes 3 epochs and reports the
best epoch of its evaluation set (MMLU: 1 epoch, the last); here the best epoch is chosen on ``choose`` and its
``report`` accuracy is the score, so nothing reported was chosen on. :class:`TaskFinetuning` records every epoch's
accuracies and the untuned model's (the full sanity check before training) and writes ``finetune.json`` at the end of
``fit``.

    lit-dof fit --config configs/finetune/arc_easy.yaml --model.init_args.teacher runs/.../student
"""

from __future__ import annotations

import functools
import os
from typing import Literal

import lightning as L
import torch

from lit_dof.evaluation.multiple_choice import option_scores, score_matrix
from lit_dof.pipeline.validation import check_fit_steps, check_learning_rate, check_number
from lit_dof.students.trainable import OptimizerCallable, Trainable, check_trainable, trainable_parameters
from lit_dof.teacher import DEFAULT_TEACHER

SPLITS = ("choose", "report")
"""The evaluation splits, in the order of the data module's validation loaders."""


class TaskFinetuning(L.LightningModule):
    """Fine-tune a teacher or an exported student on one multiple-choice task (METHOD.md §4).

    Args:
        teacher: the model to fine-tune: a teacher source or an exported student directory (named
            ``teacher`` so the CLI links it to the data module's tokenizer).
        trainable: ``"all"`` (the paper's full fine-tuning), ``"attention"`` (attention blocks, linear twins
            included) or ``"feature_maps"`` (only φ of a student).
        lr: the learning rate (after a linear warm-up, constant).
        optimizer: builds the optimizer from the trainable parameters' one group (which carries ``lr``); a callable
            ``params -> Optimizer``, in YAML a ``class_path`` with ``init_args``; ``None`` (default): AdamW
            without weight decay. Not a hyperparameter.
        warmup_steps: linear warm-up length (optimizer steps).
        seq_len: linked from the data module.
        selection: ``"best"`` (paper: the best epoch; here chosen on the ``choose`` split) or ``"last"`` (paper's
            MMLU rule) — the epoch whose ``report`` accuracy ``finetune.json`` gives as ``score``.

    Raises:
        ValueError: unknown ``trainable``/``selection``, an ``lr`` that is not a finite number > 0, a negative
            ``warmup_steps``, or nothing to train.
    """

    def __init__(
        self,
        teacher: str = DEFAULT_TEACHER,
        trainable: Trainable = "all",
        lr: float = 1e-5,
        optimizer: OptimizerCallable | None = None,
        warmup_steps: int = 10,
        seq_len: int = 512,
        selection: Literal["best", "last"] = "best",
    ) -> None:
        super().__init__()
        check_trainable(trainable)
        if selection not in ("best", "last"):
            raise ValueError(f"selection must be 'best' or 'last', got {selection!r}")
        check_learning_rate("lr", lr, example=1e-5, what="the fine-tuning learning rate")
        check_number("warmup_steps", warmup_steps, minimum=0, integer=True, example=10, what="linear warm-up steps")
        self.save_hyperparameters(ignore=["optimizer"])
        self.teacher_name, self.trainable, self.lr, self.optimizer_factory = teacher, trainable, lr, optimizer
        self.warmup_steps, self.seq_len, self.selection = warmup_steps, seq_len, selection
        self.model = None
        self.history: list[dict] = []
        self.before: dict | None = None
        self._sums = torch.zeros(2, 3)
        self._correct: list[list[int]] = [[], []]

    def setup(self, stage: str) -> None:
        """Before :meth:`configure_model` loads the model, refuse a fit that trains nothing.

        Args:
            stage: Lightning's stage (only ``"fit"`` is checked).

        Raises:
            ValueError: ``max_steps``, ``max_epochs`` or ``limit_train_batches`` 0
                (lit_dof.pipeline.validation.check_fit_steps).
        """
        if stage == "fit" and self._trainer is not None:
            check_fit_steps(self._trainer, needs_max_steps=False)

    def configure_model(self) -> None:
        """Load the model (once) and unfreeze the parameters ``trainable`` selects; leave it in train mode.

        Raises:
            ValueError: ``trainable`` selects no parameter of the model.
        """
        if self.model is not None:
            return
        from lit_dof.evaluation.loading import load_model

        self.model, _ = load_model(self.teacher_name)
        self.model.requires_grad_(False)
        chosen = trainable_parameters(self.model, self.trainable)
        if not chosen:
            raise ValueError(f"trainable={self.trainable!r} selects no parameter of {self.teacher_name}")
        for _, parameter in chosen:
            parameter.requires_grad_(True)
        self.model.train()  # from_pretrained returns eval mode; dropout (if any) belongs to fine-tuning

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Cross-entropy of the gold option under the softmax over the option log-likelihoods.

        Raises:
            FloatingPointError: a non-finite loss.
        """
        matrix = score_matrix(option_scores(self.model, batch), batch)
        loss = torch.nn.functional.cross_entropy(matrix, batch["gold"])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite fine-tuning loss at step {self.global_step}; lower the learning rate")
        self.log("train/loss", loss.detach(), prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        """Reset the epoch's sums: per split (choose, report) correct, correct length-normalised, examples; and the
        per-document record."""
        self._sums = torch.zeros(2, 3)
        self._correct = [[], []]

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Add the batch's correct answers by summed (acc) and per-character (acc_norm) log-likelihood, and its size,
        to the sums of its split (loader 0: choose, 1: report), and each document's right (1) or wrong (0) answer to
        its record."""
        scores = option_scores(self.model, batch)
        matrix = score_matrix(scores, batch)
        normed = score_matrix(scores / batch["lengths"].clamp_min(1), batch)
        gold = batch["gold"]
        right = matrix.argmax(-1) == gold
        self._sums[dataloader_idx] += torch.tensor(
            [float(right.sum()), float((normed.argmax(-1) == gold).sum()), float(len(gold))]
        )
        self._correct[dataloader_idx] += right.int().tolist()

    def on_validation_epoch_end(self) -> None:
        """Reduce the sums over ranks, log ``choose/acc`` … ``report/acc_norm``; record the epoch (the sanity check
        of a fresh fit — ``num_sanity_val_steps: -1`` — as ``before``, the untuned model)."""
        sums = self._sums.to(self.device)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed:
            torch.distributed.all_reduce(sums)
        entry = {}
        for split, row, correct in zip(SPLITS, sums.tolist(), self._correct):
            if row[2]:
                entry[split] = {"acc": row[0] / row[2], "acc_norm": row[1] / row[2], "examples": int(row[2])}
                if not distributed:  # in document order (ranks see interleaved, padded shares)
                    entry[split]["correct"] = "".join(map(str, correct))
                if not self.trainer.sanity_checking:
                    self.log(f"{split}/acc", entry[split]["acc"], prog_bar=split == "choose")
                    self.log(f"{split}/acc_norm", entry[split]["acc_norm"])
        if self.trainer.sanity_checking:
            if self.global_step == 0 and all(s in entry for s in SPLITS):  # not a resumed fit's re-check
                self.before = entry
        else:
            self.history.append({"epoch": self.current_epoch, "step": self.global_step, **entry})

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep the measured epochs (and ``before``) in the checkpoint, so a resumed fit reports them all."""
        checkpoint["finetune_history"] = {"before": self.before, "history": self.history}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore what :meth:`on_save_checkpoint` kept."""
        kept = checkpoint.get("finetune_history", {})
        self.before, self.history = kept.get("before"), list(kept.get("history", []))

    def configure_optimizers(self):
        """The ``optimizer`` (default AdamW) over the trainable parameters at ``lr``, warmed up linearly over
        ``warmup_steps``, then constant."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        factory = self.optimizer_factory or functools.partial(torch.optim.AdamW, weight_decay=0.0)
        optimizer = factory([{"params": params, "lr": self.lr}])
        warmup = max(1, self.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def summary(self) -> dict:
        """What ``finetune.json`` holds.

        Returns:
            ``{"history", "before", "chosen", "selection", "score", "choose_score", "zero_shot", "lr", "trainable",
            "model"}``: every validated epoch's ``choose`` and ``report`` accuracies; the untuned model's
            (``None`` without the sanity check); the epoch :attr:`selection` picks — the best ``choose`` accuracy
            (the first on ties) or the last —; its ``report`` accuracy (``score``) and ``choose`` accuracy; the
            untuned model's ``report`` accuracy (``zero_shot``, the same documents).
        """
        measured = [h for h in self.history if "choose" in h]
        if not measured:
            chosen = None
        elif self.selection == "best":
            chosen = max(measured, key=lambda h: (h["choose"]["acc"], -h["epoch"]))
        else:
            chosen = measured[-1]

        def acc(entry: dict | None, split: str) -> float | None:
            return entry[split]["acc"] if entry and split in entry else None

        return {
            "history": self.history,
            "before": self.before,
            "chosen": chosen,
            "selection": self.selection,
            "score": acc(chosen, "report"),
            "choose_score": acc(chosen, "choose"),
            "zero_shot": acc(self.before, "report"),
            "lr": self.lr,
            "trainable": self.trainable,
            "model": self.teacher_name,
        }

    def on_fit_end(self) -> None:
        """Write :meth:`summary` to ``<log_dir>/finetune.json`` on rank 0, atomically."""
        from lit_dof.io import atomic_write_json

        log_dir = self.trainer.log_dir
        if self.trainer.is_global_zero and log_dir:
            atomic_write_json(os.path.join(log_dir, "finetune.json"), self.summary())
