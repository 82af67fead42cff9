"""Layer-wise distillation (paper §3; METHOD.md §3): every linear twin learns its teacher layer's attention.

One teacher forward per batch (the student in :meth:`~lit_dof.students.LitDofForCausalLM.teacher_mode`,
whose projections *are* the teacher's) captures every layer's post-RoPE q/k; each layer's loss (an injected
:class:`~lit_dof.students.layer_losses.LayerLoss`: softmax rows, L2 kernel or block output) reaches only its own
feature map, so the summed loss trains all layers independently and at once. Only feature-map parameters
train: ``z`` at ``lr_z`` (paper: 0.02), ``log_alpha`` at ``lr_alpha`` (paper: 0.2 for α), anything else
(DiJiang's diagonal, Hedgehog's projection) at ``lr``; Adam with linear warm-up and cosine decay.

Optionally the last ``finetune_fraction`` of the optimizer steps switch to an **end-to-end** objective: the same
feature-map parameters train through the whole linearised model against the teacher's next-token
distribution (:func:`~lit_dof.students.losses.logit_distillation_loss`), from a fresh Adam state at
``finetune_lr_ratio`` × the base learning rates, decaying by cosine. Layer-wise training matches each layer
on the *teacher's* inputs; the end-to-end tail corrects the errors that compound when every layer is
linear — the "attention transfer, then fine-tune" recipe of Hedgehog (Zhang et al. 2024, §4) and LoLCATs
(Zhang et al. 2025, §3). A tail step costs several layer-wise steps: it runs a backward through the whole model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Literal

import torch

from lit_dof.pipeline.module import StudentModule
from lit_dof.pipeline.optimization import parameter_groups, phase_schedule
from lit_dof.pipeline.position_shift import shifted_position_ids
from lit_dof.pipeline.teacher_reuse import ReusedCapture, kept_batch
from lit_dof.pipeline.validation import check_position_shift, check_schedule
from lit_dof.pipeline.window_dropout import WindowDropout
from lit_dof.students.layer_losses import LayerLoss, SoftmaxRowLoss, resolve_layer_loss
from lit_dof.students.losses import logit_distillation_loss
from lit_dof.students.query_rows import StratifiedRows
from lit_dof.students.trainable import OptimizerCallable
from lit_dof.teacher.capture import CapturedAttention, capture_attention
from lit_dof.teacher.families import has_rotary_positions, text_config

_DEFAULT_LOSS = SoftmaxRowLoss()  # stateless, so one shared default instance is safe


class _CapturedAll(Exception):
    """Raised inside the teacher's forward once the last twin's layer is captured (nothing above is needed)."""


class LayerwiseDistillation(StudentModule):
    """The paper's layer-wise phase (softmax or L2 kernel loss), as a LightningModule.

    The arguments of StudentModule (teacher, feature map, window, export, …) come first; its own:

    Args:
        loss: the layer loss, a LayerLoss (lit_dof.students.layer_losses; configs: its ``class_path``):
            ``SoftmaxRowLoss`` (default) or ``KernelL2Loss`` (paper §3), ``OutputLoss`` (block-output matching,
            Distill-then-Replace), or your own subclass. The legacy strings ``"softmax"``, ``"l2"`` and ``"output"``
            of saved configs are accepted.
        lr_z: learning rate of the feature maps' projections z.
        lr_alpha: learning rate of the feature maps' log α.
        lr: learning rate of every other trainable parameter (DiJiang's diagonal, Hedgehog's projection, …).
        lr_lora: learning rate of the LoRA adapters (``lora``); like every group it is scaled by
            ``finetune_lr_ratio`` in the end-to-end tail, the only phase in which they receive gradients.
        warmup_steps: linear warm-up length (optimizer steps).
        min_lr_ratio: floor of the cosine decay, as a fraction of each learning rate.
        query_rows: score R random query rows per sequence (``None``: all), or a StratifiedRows (students.query_rows).
        optimizer: builds the optimizer from the parameter groups, each carrying its own ``lr`` (a callable
            ``params -> Optimizer``; in YAML a ``class_path`` with ``init_args`` but no ``lr``, e.g.
            ``{class_path: torch.optim.AdamW, init_args: {weight_decay: 0.01}}``); ``None`` (default): Adam with
            β = (0.9, 0.99) and no weight decay. Not a hyperparameter: a resumed run must pass the same one.
        finetune_fraction: the last this fraction of the optimizer steps (rounded) train end-to-end against
            the teacher's logits (0: layer-wise only, the paper's recipe; 1: end-to-end only).
        finetune_lr_ratio: learning rates of that tail, as a fraction of ``lr_z``/``lr_alpha``/``lr``.
        kd_temperature: temperature of its logit distillation.
        teacher_reuse: k ≥ 1 — each layer-wise teacher pass (the captured q/k/v) serves k consecutive training
            batches (micro-batches under gradient accumulation); the other k − 1 batches are skipped. More
            feature-map updates per CPU-minute at the price of fewer distinct tokens (1 / k of them); 1 (the
            paper's recipe) captures every batch and keeps nothing between steps. A run resumed inside a group
            re-creates its capture from the same batch (lit_dof.pipeline.teacher_reuse).
        position_shift: S ≥ 0 — every training sequence's position ids start at an offset drawn uniformly from
            [0, S] (per row, teacher and student alike) instead of 0 (why and when: lit_dof.pipeline.position_shift);
            ``"auto"``: the teacher's ``max_position_embeddings`` − ``seq_len`` for a rotary teacher, 0 for one
            with absolute position embeddings (resolved at ``configure_model``); 0: the paper's recipe.
        layer_backward: differentiate each layer's loss as soon as it is computed and free its graph (and, with
            ``teacher_reuse`` 1, its captured q/k/v): the layer-wise peak holds one layer's loss graph, not L of
            them; the same gradients as one backward of the summed loss. ``False``: that one backward.
        window_dropout: cut every sliding-window twin's exact window on a random share of the layer-wise steps,
            so the far term must carry more (lit_dof.pipeline.window_dropout; ``None``: never).

    Raises:
        ValueError: an unknown ``loss``, ``finetune_fraction`` outside [0, 1], a negative ``position_shift``, a
            learning rate, ``finetune_lr_ratio`` or ``kd_temperature`` that is not a finite number > 0, a negative
            ``warmup_steps``, ``min_lr_ratio`` outside [0, 1] (lit_dof.pipeline.validation.check_schedule); at
            ``setup``, before the teacher loads, a fit without ``max_steps`` >= 1, a ``seq_len`` or ``position_shift``
            past the teacher's ``max_position_embeddings`` or a shift on a teacher without rotary positions.
    """

    NOT_HYPERPARAMETERS = (*StudentModule.NOT_HYPERPARAMETERS, "optimizer")

    def __init__(
        self,
        *args,
        loss: LayerLoss | str = _DEFAULT_LOSS,
        lr_z: float = 0.02,
        lr_alpha: float = 0.2,
        lr: float = 0.02,
        lr_lora: float = 1e-3,
        warmup_steps: int = 20,
        min_lr_ratio: float = 0.1,
        query_rows: int | StratifiedRows | None = None,
        optimizer: OptimizerCallable | None = None,
        finetune_fraction: float = 0.0,
        finetune_lr_ratio: float = 0.1,
        kd_temperature: float = 1.0,
        teacher_reuse: int = 1,
        position_shift: int | Literal["auto"] = 0,
        layer_backward: bool = True,
        window_dropout: WindowDropout | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        layer_loss = resolve_layer_loss(loss)
        if not 0.0 <= finetune_fraction <= 1.0:
            raise ValueError(f"finetune_fraction must be in [0, 1], got {finetune_fraction}")
        if isinstance(teacher_reuse, bool) or not isinstance(teacher_reuse, int) or teacher_reuse < 1:
            raise ValueError(f"teacher_reuse must be an integer >= 1, got {teacher_reuse!r}")
        if position_shift != "auto" and (
            isinstance(position_shift, bool) or not isinstance(position_shift, int) or position_shift < 0
        ):
            raise ValueError(f"position_shift must be an integer >= 0 or 'auto', got {position_shift!r}")
        check_schedule(
            lr_z=lr_z,
            lr_alpha=lr_alpha,
            lr=lr,
            lr_lora=lr_lora,
            warmup_steps=warmup_steps,
            min_lr_ratio=min_lr_ratio,
            finetune_lr_ratio=finetune_lr_ratio,
            kd_temperature=kd_temperature,
            query_rows=query_rows,
        )
        self.save_hyperparameters(ignore=list(self.NOT_HYPERPARAMETERS))
        self.layer_loss = layer_loss
        self.lr_z, self.lr_alpha, self.lr, self.lr_lora = lr_z, lr_alpha, lr, lr_lora
        self.warmup_steps, self.min_lr_ratio = warmup_steps, min_lr_ratio
        self.query_rows, self.optimizer_factory = query_rows, optimizer
        self.finetune_fraction, self.finetune_lr_ratio = finetune_fraction, finetune_lr_ratio
        self.kd_temperature = kd_temperature
        self.teacher_reuse, self.layer_backward, self.window_dropout = teacher_reuse, layer_backward, window_dropout
        self.position_shift = position_shift
        self._shift_generator = torch.Generator()
        self._reuse = ReusedCapture(teacher_reuse)  # which batch captures, the kept capture (checkpointed)
        self._rows_generator = torch.Generator()
        self._finetune_reset_at: int | None = None

    def check_teacher(self, teacher: torch.nn.Module) -> None:
        """Resolve ``position_shift="auto"`` from the teacher and check the shift against it (again: ``setup`` checked
        an explicit one against the teacher's config; lit_dof.pipeline.validation.check_position_shift).

        Raises:
            ValueError: a shift for a teacher without RoPE, or ``position_shift + seq_len`` beyond its
                ``max_position_embeddings``.
        """
        super().check_teacher(teacher)
        if self.position_shift == "auto":
            limit = getattr(text_config(teacher), "max_position_embeddings", None)
            rotary = has_rotary_positions(teacher)
            self.position_shift = max(0, limit - self.seq_len) if rotary and limit is not None else 0
        check_position_shift(teacher.config, self.seq_len, self.position_shift)

    def _position_ids(self, batch: dict, batch_idx: int, step: int | None = None) -> torch.Tensor | None:
        """``(B, T)`` position ids of a training batch: ``None`` (the model's own, from 0) without
        ``position_shift``, else each row's positions (counted over its attended tokens when the batch has an
        ``attention_mask``) plus a random offset in [0, position_shift], seeded by the step (``step``, default the
        current global step) so that a resumed run draws the same offsets."""
        if not self.position_shift:
            return None
        if self.position_shift == "auto":
            raise RuntimeError("position_shift='auto' is resolved from the teacher at configure_model")
        seed = (self.global_step if step is None else step) * 104729 + batch_idx
        return shifted_position_ids(batch, self.position_shift, seed, self._shift_generator)

    # -- the two phases ----------------------------------------------------------------------------------
    def _total_steps(self) -> int:
        return max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1000

    @property
    def end_to_end_fraction(self) -> float:
        """The share of the optimizer steps that train end to end (``finetune_fraction``, the tail)."""
        return self.finetune_fraction

    def finetune_start(self) -> int:
        """First optimizer step of the end-to-end tail (= total steps when there is none)."""
        total = self._total_steps()
        return total - round(self.finetune_fraction * total)

    def in_finetune(self) -> bool:
        """Whether this optimizer step belongs to the end-to-end tail (:meth:`finetune_start` onwards)."""
        return self.global_step >= self.finetune_start()

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """At the first step of the end-to-end tail, clear Adam's moments (once, also across resumes)."""
        start = self.finetune_start()
        if 0 < start < self._total_steps() and self.global_step == start and self._finetune_reset_at != start:
            # The tail's gradients have another scale than the layer losses': start Adam's moments afresh.
            # Keyed on global_step, so a resume before, at or after the switch reproduces the same run.
            for optimizer in self.trainer.optimizers:
                optimizer.state.clear()
            self._finetune_reset_at = start

    def _teacher_forward(
        self, batch: dict, *, capture: bool, logits: bool = True, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, dict[int, CapturedAttention]]:
        """One frozen-teacher forward: its logits and, if ``capture``, every layer's
        :class:`~lit_dof.teacher.capture.CapturedAttention` (q, k, key padding; v and the attention output only
        when the layer loss ``needs_values``, v also for twins whose far memory has a gate).

        ``logits=False`` (the layer-wise steps, which discard them): the forward stops as soon as the last twin's
        layer has been captured — the layers above it, the final norm and the LM head never run — unless the
        teacher is sharded (FSDP2 must see every forward finish). Returns ``None`` logits then. ``positions``:
        ``(B, T)`` position ids (``None``: the model's own)."""
        captured: dict[int, CapturedAttention] = {}
        keep_values = self.layer_loss.needs_values
        keep_v = keep_values or any(twin.far_gated for twin in self.student.linear_modules().values())  # gates read v
        last = max(self.student.linear_modules(), default=None)
        stop_early = capture and not logits and last is not None and getattr(self, "_replicated_group", None) is None

        def record(index: int, c: CapturedAttention) -> None:
            captured[index] = c if keep_values else dataclasses.replace(c, v=c.v if keep_v else None, out=None)
            if stop_early and index == last:
                raise _CapturedAll

        recording = capture_attention(self.student.model, record) if capture else contextlib.nullcontext()
        out = None
        with torch.no_grad(), self.student.teacher_mode(), recording:  # root forward (FSDP)
            try:
                out = self.student(
                    batch["input_ids"],
                    attention_mask=batch.get("attention_mask"),
                    position_ids=positions,
                    use_cache=False,
                ).logits
            except _CapturedAll:
                pass
        return out, captured

    def _layerwise_capture(self, batch: dict, batch_idx: int = 0) -> tuple[dict[int, CapturedAttention], bool]:
        """``(captured teacher attention, fresh)`` of this layer-wise batch: a new teacher pass every
        ``teacher_reuse`` batches, else the kept one — re-created from its own batch after a resume inside a group
        (lit_dof.pipeline.teacher_reuse)."""
        reuse = self._reuse
        if reuse.needs_recapture():
            kept = kept_batch(self._trainer, reuse.group_start())
            if kept is not None:
                step, kept_idx = reuse.fresh_at
                positions = self._position_ids(kept, kept_idx, step=step)
                reuse.capture = self._teacher_forward(kept, capture=True, logits=False, positions=positions)[1]
        fresh = reuse.due() or reuse.capture is None
        reuse.batches += 1
        if not fresh:
            return reuse.capture, False
        reuse.fresh_at, reuse.capture = (self.global_step, batch_idx), None  # free the old capture first
        positions = self._position_ids(batch, batch_idx)
        captured = self._teacher_forward(batch, capture=True, logits=False, positions=positions)[1]
        if self.teacher_reuse > 1:
            reuse.capture = captured
        return captured, True

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Also record the ``teacher_reuse`` position (:meth:`ReusedCapture.state_dict`)."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["lit_dof_teacher_reuse"] = self._reuse.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Also restore the ``teacher_reuse`` position (a checkpoint without one: the next batch captures)."""
        super().on_load_checkpoint(checkpoint)
        if "lit_dof_teacher_reuse" in checkpoint:
            self._reuse.load_state_dict(checkpoint["lit_dof_teacher_reuse"])

    def _layer_losses(self, captured: dict[int, CapturedAttention], batch_idx: int) -> dict[int, torch.Tensor]:
        """Each linear layer's attention loss on the teacher's q/k, logged as ``train/loss_layer_XX``."""
        return {index: loss for index, _, loss in self._each_layer_loss(captured, batch_idx)}

    def _each_layer_loss(self, captured: dict[int, CapturedAttention], batch_idx: int):
        """Yields ``(index, twin, loss)`` layer by layer, so a caller can backward and free each graph in turn."""
        self._rows_generator.manual_seed(self.global_step * 7919 + batch_idx)
        twins, rows = self.student.linear_modules(), {"query_rows": self.query_rows, "generator": self._rows_generator}
        dropout = self.window_dropout if self.window_dropout and not self.in_finetune() else WindowDropout(rate=0)
        with dropout.applied(twins.values(), self.global_step, batch_idx):  # the tail's measured losses: uncut
            for index, twin in twins.items():
                if not getattr(twin, "far_term", True):
                    continue  # a window without a far term (a control): nothing to distil
                loss = self.layer_loss(twin, captured[index], **rows)
                self.log(f"train/loss_layer_{index:02d}", loss.detach())
                yield index, twin, loss
                del loss

    def _layerwise_backward(
        self, captured: dict[int, CapturedAttention], batch_idx: int, release: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """Per-layer backward: each layer's loss is differentiated (``torch.autograd.grad``) as soon as it is
        computed and its graph freed — and, when ``release``, the layer's captured q/k/v too — so the peak holds
        one layer's loss graph instead of all of them. The gradients come back as the surrogate Σ_p ⟨p, g_p⟩
        (g detached), whose backward — Lightning's, with its precision scaling, gradient accumulation and DDP
        hooks — accumulates exactly g_p into ``p.grad``.

        Returns:
            ``(surrogate, summed layer loss (detached), number of layers)``; ``None`` s when no layer has a loss.
        """
        gradients: dict[torch.nn.Parameter, torch.Tensor] = {}
        total, count = None, 0
        for index, twin, loss in self._each_layer_loss(captured, batch_idx):
            total, count = (loss.detach() if total is None else total + loss.detach()), count + 1
            params = [p for p in twin.parameters() if p.requires_grad]
            if params and loss.requires_grad:
                for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True)):
                    if g is not None:
                        gradients[p] = gradients[p] + g if p in gradients else g
            del loss
            if release:
                captured.pop(index, None)
        surrogate = sum((p * g).sum() for p, g in gradients.items()) if gradients else None
        return surrogate, total, count

    def finetune_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        """End-to-end step: KL(teacher ‖ student) of next-token distributions, per token.

        On the steps the logger writes (``log_every_n_steps``), the per-layer attention losses are measured
        too, without gradients, from the same teacher forward (so TensorBoard shows how the tail moves them,
        and Lightning does not repeat the layer-wise phase's last values), with their mean as ``train/loss``.
        """
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        every = self.trainer.log_every_n_steps if self._trainer is not None else 1
        measure = bool(every) and (self.global_step + 1) % every == 0
        positions = self._position_ids(batch, batch_idx)
        teacher_logits, captured = self._teacher_forward(batch, capture=measure, positions=positions)
        if measure:
            with torch.no_grad():
                measured = self._layer_losses(captured, batch_idx)
            if measured:
                self.log("train/loss", sum(measured.values()) / len(measured), prog_bar=True)
        logits = self.student(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        loss = logit_distillation_loss(logits, teacher_logits, mask, temperature=self.kd_temperature)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite logit distillation loss at step {self.global_step}; lower finetune_lr_ratio"
            )
        self.log("train/logit_kd", loss.detach(), prog_bar=True)
        self.count_tokens(ids.numel())
        return loss if loss.requires_grad else None

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        """A layer-wise step (the layer losses on the teacher's capture) or, in the tail, :meth:`finetune_step`.

        Returns:
            the loss to back-propagate (with ``layer_backward``, the surrogate whose backward accumulates each
            layer's gradients), or ``None`` when nothing is trainable.
        """
        if self.in_finetune():
            return self.finetune_step(batch, batch_idx)
        captured, fresh = self._layerwise_capture(batch, batch_idx)
        self.count_tokens(batch["input_ids"].numel() if fresh else 0)  # reused captures add no new tokens
        if self.layer_backward and torch.is_grad_enabled():
            result, total, count = self._layerwise_backward(captured, batch_idx, release=self.teacher_reuse == 1)
        else:
            losses = self._layer_losses(captured, batch_idx)
            total, count = (sum(losses.values()), len(losses)) if losses else (None, 0)
            result = total if total is not None and total.requires_grad else None
        if count:
            self.log("train/loss", total.detach() / count, prog_bar=True)
        return result  # None: nothing trainable (e.g. Performer): just log

    def optimizer_groups(self) -> list[dict]:
        """Adam's parameter groups: each feature map's parameters in the group its
        :meth:`~lit_dof.attention.FeatureMap.param_groups` names (``z`` at ``lr_z``, ``log_alpha`` at ``lr_alpha``,
        ``other`` at ``lr``), LoRA adapters (peft's ``lora_`` parameters) at ``lr_lora``, any other trainable
        parameter (a sliding window's far-term weight β) in ``other``.

        Returns:
            ``[{"params", "lr", "name"}]`` for the non-empty groups.

        Raises:
            ValueError: a feature map names a group outside :data:`~lit_dof.attention.feature_maps.base.PARAM_GROUPS`
                (lit_dof.pipeline.optimization.parameter_groups).
        """
        lrs = {"z": self.lr_z, "log_alpha": self.lr_alpha, "other": self.lr, "lora": self.lr_lora}
        return parameter_groups(self.student, self.trainable_parameters(), lrs)

    def configure_optimizers(self):
        """The ``optimizer`` (default Adam) over :meth:`optimizer_groups`; linear warm-up then cosine decay to
        ``min_lr_ratio``; in the tail a second cosine from ``finetune_lr_ratio``. ``None`` when nothing is trainable."""
        params = self.optimizer_groups()
        if not params:
            return None  # e.g. Performer: nothing to train (validation and export still run)
        factory = self.optimizer_factory or functools.partial(torch.optim.Adam, betas=(0.9, 0.99))
        optimizer = factory(params)
        schedule = phase_schedule(
            self._total_steps(), self.finetune_start(), self.warmup_steps, self.min_lr_ratio, self.finetune_lr_ratio
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
