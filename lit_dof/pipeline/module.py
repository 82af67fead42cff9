"""Shared base of the training phases: build the student inside ``configure_model``, validate perplexity,
export the student at the end of ``fit``.

The student is built in :meth:`StudentModule.configure_model` (Lightning calls it under the strategy's
init context, so FSDP can shard it): the teacher is loaded, the planning callbacks
(:class:`~lit_dof.pipeline.callbacks.DoFEstimator`, then
:class:`~lit_dof.pipeline.callbacks.FeatureDimAllocator`) see it and choose the per-layer feature
dimensions, and :func:`lit_dof.linearize` attaches the twins — all before optimizers are created and
before DDP/FSDP wrap the model, so resizing never invalidates an optimizer or a wrapper.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import lightning as L
import torch
from torchmetrics.text import Perplexity

from lit_dof.attention import FeatureMap, LearnedPRF
from lit_dof.precision import DtypeName, fp32_region, resolve_dtype
from lit_dof.students.modeling import LitDofForCausalLM, linearize
from lit_dof.teacher.families import attention_layers

FeatureMapFactory = Callable[[int, int, int], FeatureMap]


class StudentModule(L.LightningModule):
    """Base of the layer-wise and direct phases.

    Args:
        teacher: alias, directory, ``.gguf`` file or hub id (:func:`lit_dof.load_teacher`).
        feature_map: ``(head_dim, num_heads, feature_dim) -> FeatureMap`` — in YAML a ``class_path`` with
            optional ``init_args`` (e.g. ``lit_dof.attention.PerformerFeatureMap``).
        feature_dim: M for every layer when no allocator callback sets the dims (default: the head size).
        softmax_layers: layers kept softmax (hybrids).
        share_kv_maps: one map per KV head (default) or per query head.
        chunk_size: chunk size of the linear-attention kernel.
        seq_len: training block length in tokens (linked from ``data.seq_len`` by the CLI).
        export_dir: where ``fit`` writes the student (default ``<log_dir>/student``); ``""`` disables.
        teacher_dtype: dtype the teacher's weights are loaded in: ``"auto"`` (default) follows the trainer's
            precision (``bf16-true`` → ``"bfloat16"``, ``16-true`` → ``"float16"``, anything else, the mixed
            precisions included, → ``"float32"``), or ``"float32"``, ``"bfloat16"``, ``"float16"``. Under a
            true-half precision Lightning converts the teacher to that dtype anyway. The feature maps are
            float32 whatever this is (master weights; see :class:`~lit_dof.attention.FeatureMap`).

    Raises:
        ValueError: an unknown ``teacher_dtype``.
    """

    def __init__(
        self,
        teacher: str = "smollm2-135m-instruct",
        feature_map: FeatureMapFactory = LearnedPRF,
        feature_dim: int | None = None,
        softmax_layers: Sequence[int] = (),
        share_kv_maps: bool = True,
        chunk_size: int = 64,
        seq_len: int = 512,
        export_dir: str | None = None,
        teacher_dtype: DtypeName = "auto",
    ) -> None:
        super().__init__()
        resolve_dtype(teacher_dtype, None)  # validate the name now, not at configure_model
        self.save_hyperparameters(ignore=["feature_map"])
        self.teacher_name = teacher
        self.feature_map = feature_map
        self.feature_dim = feature_dim
        self.softmax_layers = list(softmax_layers)
        self.share_kv_maps, self.chunk_size, self.seq_len = share_kv_maps, chunk_size, seq_len
        self.export_dir = export_dir
        self.teacher_dtype = teacher_dtype
        self.student: LitDofForCausalLM | None = None
        self.tokenizer = None
        self.feature_dims: list[int] | None = None  # set by FeatureDimAllocator
        self.dof_report = None  # set by DoFEstimator
        self.val_ppl_student = Perplexity()
        self._teacher_val_cache: dict[int, tuple[float, int]] = {}
        self._teacher_nll = [0.0, 0]

    # -- building ------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.student is not None:
            return
        from lit_dof.teacher.loading import load_teacher

        trainer = self._trainer
        teacher, self.tokenizer = load_teacher(self.teacher_name, dtype=self.resolved_teacher_dtype())
        callbacks = list(trainer.callbacks) if trainer is not None else []
        for stage in ("estimate", "allocate"):  # DoF first, then the allocation that reads it
            for callback in callbacks:
                if getattr(callback, "planning_stage", None) == stage:
                    callback.on_teacher_ready(trainer, self, teacher)
        layers = attention_layers(teacher)
        dims = self.feature_dims or [self.feature_dim or layers[0].head_dim] * len(layers)
        self.student = linearize(teacher, self.feature_map, dims, softmax_layers=self.softmax_layers,
                                 share_kv_maps=self.share_kv_maps, chunk_size=self.chunk_size)  # fmt: skip
        self.student.requires_grad_(False)
        for name, parameter in self.trainable_parameters():
            parameter.requires_grad_(True)
        mesh = self._lightning_device_mesh()
        if mesh is not None:
            self._shard(mesh)

    def resolved_teacher_dtype(self) -> torch.dtype:
        """The teacher's parameter dtype: ``teacher_dtype``, with ``"auto"`` read from ``trainer.precision``
        (float32 without a trainer)."""
        precision = self._trainer.precision if self._trainer is not None else None
        return resolve_dtype(self.teacher_dtype, precision)

    def _lightning_device_mesh(self):
        try:
            return self.device_mesh  # set by ModelParallelStrategy (FSDP2)
        except (AttributeError, RuntimeError):
            return None

    def _shard(self, mesh) -> None:
        """FSDP2: shard the teacher at its decoder-layer class (``_no_split_modules``); keep the twins
        replicated (they are small and their losses run outside the layers' forward), all-reducing their
        gradients in :meth:`on_after_backward`."""
        from torch.distributed.fsdp import fully_shard

        dp = mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh
        named_twins = [(n, p) for n, p in self.student.named_parameters() if ".lit_dof." in n]
        twins = {p for _, p in named_twins}
        layer_classes = set(getattr(self.student.model, "_no_split_modules", None) or [])
        for module in self.student.model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, mesh=dp, ignored_params=twins & set(module.parameters()))
        fully_shard(self.student, mesh=dp, ignored_params=twins)
        self._replicated = [p for _, p in sorted(named_twins, key=lambda item: item[0]) if p.requires_grad]  # same order on every rank
        self._replicated_group = dp.get_group()

    def on_after_backward(self) -> None:
        replicated = [p for p in getattr(self, "_replicated", ()) if p.grad is not None]
        if replicated and torch.distributed.is_initialized():
            # One coalesced all-reduce (SUM, then divide: gloo has no AVG) of the replicated twins' gradients.
            flat = torch.cat([p.grad.reshape(-1) for p in replicated])
            torch.distributed.all_reduce(flat, group=self._replicated_group)
            flat /= torch.distributed.get_world_size(self._replicated_group)
            offset = 0
            for p in replicated:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    def trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) pairs this phase trains (default: the feature maps of the linear twins)."""
        return [(n, p) for n, p in self.student.named_parameters() if ".lit_dof.linear.feature_map." in n]

    # -- checkpoints: only what training changes -------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep the linear twins and trainable parameters; the frozen teacher weights are reloaded from the
        teacher on resume (a 135M teacher would add 540 MB to every checkpoint, an 8B one 32 GB)."""
        trainable = {name for name, _ in self.trainable_parameters()}
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if ".lit_dof." in k or k.removeprefix("student.") in trainable
        }
        checkpoint["lit_dof_feature_dims"] = self.student.feature_dims

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.strict_loading = False  # the teacher's weights come from the teacher, not the checkpoint
        dims = checkpoint.get("lit_dof_feature_dims")
        if dims is not None and self.student is not None and dims != self.student.feature_dims:
            raise ValueError(
                f"checkpoint feature dims {dims} differ from the rebuilt student's {self.student.feature_dims}: "
                "resume with the same DoF settings, or pass dof.report_path=<run>/dof.json"
            )

    # -- validation: held-out perplexity of teacher and student --------------------------------------------
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        ids = batch["input_ids"]
        logits = self.student(ids, use_cache=False).logits[:, :-1].float()
        with fp32_region():  # the metric's softmax and sums in float32 under any precision
            self.val_ppl_student.update(logits, ids[:, 1:])
        if batch_idx not in self._teacher_val_cache:  # validation data is deterministic: one teacher pass
            with self.student.teacher_mode():
                teacher_logits = self.student(ids, use_cache=False).logits[:, :-1].float()
            self._teacher_val_cache[batch_idx] = self._nll(teacher_logits, ids[:, 1:])
        nll_sum, count = self._teacher_val_cache[batch_idx]
        self._teacher_nll[0] += nll_sum
        self._teacher_nll[1] += count

    @staticmethod
    @fp32_region()
    def _nll(logits: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
        return float(nll), target.numel()

    def on_validation_epoch_start(self) -> None:
        self._teacher_nll = [0.0, 0]
        # bf16-true / 16-true convert the whole module, the metric's states included: sum in float32 again.
        self.val_ppl_student.set_dtype(torch.float32)

    def on_validation_epoch_end(self) -> None:
        self.log("val/ppl_student", self.val_ppl_student.compute(), prog_bar=True, sync_dist=True)
        self.val_ppl_student.reset()
        if self._teacher_nll[1]:
            teacher_ppl = torch.tensor(self._teacher_nll[0] / self._teacher_nll[1], dtype=torch.float32).exp()
            self.log("val/ppl_teacher", teacher_ppl, prog_bar=True, sync_dist=True)

    # -- export -------------------------------------------------------------------------------------------
    def on_fit_end(self) -> None:
        if self.export_dir == "" or self.student is None:
            return
        log_dir = self.trainer.log_dir  # a collective under DDP: every rank asks
        target = self.export_dir or os.path.join(log_dir or ".", "student")
        state_dict = None
        if getattr(self, "_replicated_group", None) is not None:  # FSDP2: gather full weights (collective)
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state_dict = get_model_state_dict(self.student, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.trainer.is_global_zero:
            self.student.save_pretrained(target, state_dict=state_dict)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(target)
        self.exported_to = target
