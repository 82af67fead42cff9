"""The "direct" baseline (paper §3): next-token cross-entropy through the whole linearised model.

Optionally adds logit distillation: ``logit_kd`` · KL(teacher ‖ student) over the vocabulary, with the
teacher's logits from the same model in teacher mode (shared weights, no extra memory for a second model).
What trains is configurable — ``trainable``:

* ``"feature_maps"`` (default): only φ's parameters, as in the layer-wise phase;
* ``"attention"``: φ plus the attention projections of the linearised layers (q/k/v/o);
* ``"all"``: every parameter (full fine-tuning; the teacher-mode logits then drift with it).
"""

from __future__ import annotations

import torch

from lit_dof.pipeline.layerwise import LayerwiseDistillation
from lit_dof.pipeline.validation import check_number
from lit_dof.students.losses import logit_distillation_loss
from lit_dof.students.trainable import Trainable, check_trainable, trainable_parameters


class DirectDistillation(LayerwiseDistillation):
    """End-to-end next-token training of the student (same optimizer/schedule settings as the layer-wise phase).

    The arguments of LayerwiseDistillation come first; its ``loss``/``query_rows`` are unused here and its
    ``finetune_fraction`` must stay 0 (every step here is end-to-end); ``kd_temperature`` is the softmax
    temperature of the ``logit_kd`` term. Its own:

    Args:
        trainable: ``"feature_maps"`` (only φ), ``"attention"`` (the linearised attention blocks) or ``"all"``.
        logit_kd: weight of the teacher-logit KL term (0: plain next-token loss).

    Raises:
        ValueError: a ``finetune_fraction`` other than 0, a negative or non-finite ``logit_kd``, or what
            LayerwiseDistillation refuses.
    """

    def __init__(self, *args, trainable: Trainable = "feature_maps", logit_kd: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.finetune_fraction:
            raise ValueError("finetune_fraction is a layer-wise option: every direct step is already end-to-end")
        check_number("logit_kd", logit_kd, minimum=0.0, example=0.0, what="weight of the teacher-logit KL term")
        self.trainable, self.logit_kd = check_trainable(trainable), logit_kd

    @property
    def end_to_end_fraction(self) -> float:
        """Every step trains end to end: 1."""
        return 1.0

    def trainable_parameters(self):
        """(name, parameter) pairs trained end to end: every parameter (``all``), the linear layers' attention
        blocks (``attention``) or the inherited default, the twins' feature maps (``feature_maps``)."""
        if self.trainable != "feature_maps":
            return trainable_parameters(self.student, self.trainable)
        return super().trainable_parameters()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        """Next-token cross-entropy of the student, plus ``logit_kd`` × the teacher-logit KL when set.

        Returns:
            the loss, or ``None`` when nothing is trainable.

        Raises:
            FloatingPointError: a non-finite loss.
        """
        ids = batch["input_ids"]
        positions = self._position_ids(batch, batch_idx)
        out = self.student(ids, labels=ids, position_ids=positions, use_cache=False)
        loss = out.loss
        self.log("train/ce", loss.detach(), prog_bar=True)
        if self.logit_kd > 0:
            with torch.no_grad(), self.student.teacher_mode():
                teacher_logits = self.student(ids, position_ids=positions, use_cache=False).logits
            kd = logit_distillation_loss(out.logits, teacher_logits, temperature=self.kd_temperature)
            self.log("train/logit_kd", kd.detach())
            loss = loss + self.logit_kd * kd
        self.log("train/loss", loss.detach())
        self.count_tokens(ids.numel())
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite direct loss at step {self.global_step}; lower the learning rates")
        return loss if loss.requires_grad else None
