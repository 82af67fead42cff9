"""Layer-wise distillation (paper §3; METHOD.md §3): every linear twin learns its teacher layer's attention.

One teacher forward per batch (the student in :meth:`~lit_dof.students.LitDofForCausalLM.teacher_mode`,
whose projections *are* the teacher's) captures every layer's post-RoPE q/k; each layer's loss
(:func:`~lit_dof.students.losses.attention_distillation_loss`, ``softmax`` or ``l2``) reaches only its own
feature map, so the summed loss trains all layers independently and at once. Only feature-map parameters
train: ``z`` at ``lr_z`` (paper: 0.02), ``log_alpha`` at ``lr_alpha`` (paper: 0.2 for α), anything else
(DiJiang's diagonal, Hedgehog's projection) at ``lr``; Adam with linear warm-up and cosine decay.
"""

from __future__ import annotations

import math

import torch

from lit_dof.pipeline.module import StudentModule
from lit_dof.students.losses import LossKind, attention_distillation_loss
from lit_dof.teacher.capture import capture_attention


class LayerwiseDistillation(StudentModule):
    """The paper's layer-wise phase (softmax or L2 kernel loss), as a LightningModule.

    Args (beyond :class:`~lit_dof.pipeline.module.StudentModule`):
        loss: ``"softmax"`` or ``"l2"``.
        lr_z, lr_alpha, lr: learning rates of z, log α and other feature-map parameters.
        warmup_steps: linear warm-up length (optimizer steps). min_lr_ratio: cosine floor.
        query_rows: score this many random query rows per sequence (``None``: all; see the losses module).
        betas, weight_decay: Adam settings.
    """

    def __init__(
        self,
        *args,
        loss: LossKind = "softmax",
        lr_z: float = 0.02,
        lr_alpha: float = 0.2,
        lr: float = 0.02,
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
        query_rows: int | None = None,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters(ignore=["feature_map"])
        self.loss_kind = loss
        self.lr_z, self.lr_alpha, self.lr = lr_z, lr_alpha, lr
        self.warmup_steps, self.min_lr_ratio = warmup_steps, min_lr_ratio
        self.query_rows, self.betas, self.weight_decay = query_rows, betas, weight_decay
        self._rows_generator = torch.Generator()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        ids = batch["input_ids"]
        captured: dict[int, tuple] = {}

        def record(index, q, k, v, pad, out):
            captured[index] = (q, k, pad)

        with torch.no_grad(), self.student.teacher_mode(), capture_attention(self.student.model, record):
            self.student(ids, attention_mask=batch.get("attention_mask"), use_cache=False)  # root forward (FSDP)
        self._rows_generator.manual_seed(self.global_step * 7919 + batch_idx)
        total, losses = 0.0, {}
        for index, twin in self.student.linear_modules().items():
            q, k, pad = captured[index]
            layer_loss = attention_distillation_loss(
                twin, q, k, pad, kind=self.loss_kind, query_rows=self.query_rows, generator=self._rows_generator
            )
            losses[index] = layer_loss.detach()
            total = total + layer_loss
        if not losses:
            return None
        for index, value in losses.items():
            self.log(f"train/loss_layer_{index:02d}", value)
        mean = torch.stack(list(losses.values())).mean()
        self.log("train/loss", mean, prog_bar=True)
        self.log("train/tokens", float(ids.numel()), reduce_fx="sum")
        return total if total.requires_grad else None  # nothing trainable (e.g. Performer): just log

    def configure_optimizers(self):
        groups: dict[str, list] = {"z": [], "log_alpha": [], "other": []}
        for name, parameter in self.trainable_parameters():
            leaf = name.rsplit(".", 1)[-1]
            groups[leaf if leaf in ("z", "log_alpha") else "other"].append(parameter)
        lrs = {"z": self.lr_z, "log_alpha": self.lr_alpha, "other": self.lr}
        params = [{"params": p, "lr": lrs[g], "name": g} for g, p in groups.items() if p]
        if not params:
            return None  # e.g. Performer: nothing to train (validation and export still run)
        optimizer = torch.optim.Adam(params, betas=self.betas, weight_decay=self.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1000
        warmup, floor = self.warmup_steps, self.min_lr_ratio

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
