"""Shared base of the training phases: build the student inside ``configure_model``, validate perplexity,
export the student at the end of ``fit``.

The student is built in :meth:`StudentModule.configure_model` (Lightning calls it under the strategy's
init context, so FSDP can shard it): the teacher is loaded, the module's feature-dimension planner
(:class:`~lit_dof.pipeline.planner.FeatureDimPlanner`: a DoF estimate and allocation, or one fixed M) chooses the
per-layer feature dimensions, and :func:`lit_dof.linearize` attaches the twins — all before optimizers are created
and before DDP wraps the model, so resizing never invalidates an optimizer or a wrapper. Under FSDP2 the teacher is
sharded as it loads (lit_dof.teacher.sharded), before the DoF estimate; the twins are attached after sharding
and stay outside FSDP.
"""

from __future__ import annotations

import os
from typing import Sequence

import lightning as L
import torch
from torchmetrics.aggregation import MeanMetric
from torchmetrics.text import Perplexity

from lit_dof.attention import FeatureMapFactory, LearnedPRF, SlidingWindow
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE
from lit_dof.pipeline.exact_heads import HeadProbe, resolve_exact_heads
from lit_dof.pipeline.planner import DoFPlanner, FeatureDimPlan, FeatureDimPlanner, StudentSpec
from lit_dof.pipeline.replication import all_reduce_mean, coalesced, data_parallel, fsdp_mesh
from lit_dof.pipeline.validation import check_student_setup
from lit_dof.precision import DtypeName, fp32_region, resolve_dtype
from lit_dof.students.card import write_model_card
from lit_dof.students.kernels import Kernels
from lit_dof.students.lora import LoRA, add_lora, check_targets, has_adapters, merged_state_dict
from lit_dof.students.modeling import LitDofForCausalLM, linearize
from lit_dof.students.trainable import trainable_parameters
from lit_dof.teacher import DEFAULT_TEACHER


class StudentModule(L.LightningModule):
    """Base of the layer-wise and direct phases.

    Args:
        teacher: alias, directory, ``.gguf`` file or hub id (as lit_dof.load_teacher reads it).
        feature_map: ``(head_dim, num_heads, feature_dim) -> FeatureMap`` — in YAML a ``class_path`` with
            optional ``init_args`` (e.g. ``lit_dof.attention.PerformerFeatureMap``).
        planner: chooses the per-layer feature dims once the teacher is loaded (lit_dof.pipeline.planner; in YAML
            a ``class_path``): ``DoFPlanner`` (default: the DoF estimate and the ``dof`` allocation) or
            ``FixedPlanner`` (one M everywhere, no estimate).
        softmax_layers: layers kept softmax (hybrids).
        exact_heads: ``{layer: [KV head, …]}`` kept exact inside linearised layers (full causal softmax, a growing
            KV cache; DuoAttention's retrieval heads): their feature dim becomes 0 after the planner's allocation
            (lit_dof.students.surgery.with_exact_heads); in YAML ``exact_heads: {18: [2], 20: [1, 2]}``; or a
            :class:`~lit_dof.pipeline.exact_heads.HeadProbe` (RetrievalHeads, LongRangeHeads) to find them at fit start.
        share_kv_maps: one map per KV head (default) or per query head.
        chunk_size: chunk size of the linear-attention kernel.
        sliding_window: window 0 (default) for pure linear attention; a window w ≥ 1 for sliding-window +
            linear attention (the last w tokens exact softmax, the feature map's linear attention for older ones),
            with its sink tokens, far term, mixing weight and decay (lit_dof.attention.SlidingWindow); in YAML
            ``sliding_window: {window: 64, sink_tokens: 4}``.
        lora: low-rank adapters on the teacher's projections (lit_dof.students.lora.LoRA), trained
            by the end-to-end objective and merged into the weights at export; ``None``: none.
        seq_len: training block length in tokens (linked from ``data.seq_len`` by the CLI).
        export_dir: where ``fit`` writes the student (default ``<log_dir>/student``); ``""`` disables.
        seed: seed of the twins' initial values, one derived seed per layer
            (lit_dof.students.surgery.layer_seed), so every rank builds the same twins whatever random
            numbers it drew before (ranks capture different DoF batches); default: the run's seed
            (``seed_everything``, read as ``torch.initial_seed()``).
        teacher_dtype: dtype the teacher's weights are loaded in: ``"auto"`` (default) follows the trainer's
            precision (``bf16-true`` → ``"bfloat16"``, ``16-true`` → ``"float16"``, anything else, the mixed
            precisions included, → ``"float32"``), or ``"float32"``, ``"bfloat16"``, ``"float16"``. Under a
            true-half precision Lightning converts the teacher to that dtype anyway. The feature maps are
            float32 whatever this is (master weights; see lit_dof.attention.FeatureMap).
        kernels: the sliding-window layers' kernels (lit_dof.students.kernels.Kernels; in YAML
            ``kernels: {window: flex, linear: fla}`` for GPUs); not part of the exported student.

    Checkpoints hold what training changes (:meth:`state_dict`): the frozen teacher is reloaded from the
    teacher on resume, so loading is never strict. They also keep :attr:`tokens_seen`, so that ``train/tokens``
    (:meth:`count_tokens`) is a running total across resumes.

    Raises:
        ValueError: an unknown ``teacher_dtype``.
    """

    def __init__(
        self,
        teacher: str = DEFAULT_TEACHER,
        feature_map: FeatureMapFactory = LearnedPRF,
        planner: FeatureDimPlanner = DoFPlanner(),  # settings only: one instance serves every module
        softmax_layers: Sequence[int] = (),
        exact_heads: dict[int, list[int]] | HeadProbe | None = None,
        share_kv_maps: bool = True,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        sliding_window: SlidingWindow = SlidingWindow(),
        lora: LoRA | None = None,
        seq_len: int = 512,
        export_dir: str | None = None,
        seed: int | None = None,
        teacher_dtype: DtypeName = "auto",
        kernels: Kernels = Kernels(),
    ) -> None:
        super().__init__()
        resolve_dtype(teacher_dtype, None)  # validate the name now, not at configure_model
        self.save_hyperparameters(ignore=list(self.NOT_HYPERPARAMETERS))
        self.teacher_name = teacher
        self.feature_map = feature_map
        self.planner = planner
        self.softmax_layers = list(softmax_layers)
        self.exact_heads = exact_heads  # resolved against the teacher in configure_model
        self.share_kv_maps, self.chunk_size, self.seq_len = share_kv_maps, chunk_size, seq_len
        self.lora = lora
        self.sliding_window = sliding_window
        self.export_dir, self.seed = export_dir, seed
        self.teacher_dtype, self.kernels = teacher_dtype, kernels
        self.strict_loading = False  # before any load: sharded (DCP) loads read it before on_load_checkpoint
        self.student: LitDofForCausalLM | None = None
        self.tokenizer = None
        self.plan: FeatureDimPlan | None = None  # the planner's, at configure_model
        self.val_ppl_student = Perplexity()
        self.val_nll_teacher = MeanMetric()  # per-token NLL, weighted by tokens: exact over ranks
        self._teacher_val_cache: dict[int, tuple[float, int]] = {}
        self.tokens_seen = 0  # this rank's training tokens the teacher processed, all runs of the experiment

    NOT_HYPERPARAMETERS = ("feature_map", "planner")  # objects: on_save_checkpoint records them its own way

    flops_per_batch: int | None = None
    """Not measured (``None``); declared so that Lightning's ``ThroughputMonitor`` logs no FLOPs and no warning."""

    def count_tokens(self, tokens: int) -> None:
        """Add this rank's ``tokens`` (of a training batch the teacher processed) to :attr:`tokens_seen` and log the
        running total over every rank as ``train/tokens`` (float64, summed over ranks: exact up to 2^53).

        Args:
            tokens: tokens of the batch on this rank (0: a batch that reused an earlier teacher pass).
        """
        self.tokens_seen += int(tokens)
        total = torch.tensor(float(self.tokens_seen), dtype=torch.float64, device=self.device)
        self.log("train/tokens", total, reduce_fx="sum", sync_dist=True)

    # -- building ------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Before :meth:`configure_model` loads the teacher, refuse a fit without optimizer steps and a ``seq_len``
        past the teacher's positions (lit_dof.pipeline.validation.check_student_setup: ``ValueError``)."""
        check_student_setup(self, stage)

    def configure_model(self) -> None:
        """Load the teacher, let the planner choose the feature dims (:attr:`plan`), build the student with its
        linear twins and mark the trainable parameters.

        On a device mesh (ModelParallelStrategy) the teacher is loaded already sharded (FSDP2,
        :func:`lit_dof.teacher.sharded.load_sharded_teacher`: whole on rank 0 only, in the teacher dtype, the
        other ranks build it on the meta device and receive their shards); the planner then runs on the
        sharded teacher (every rank forwards its share of the DoF batches, gathering one decoder layer at a time),
        and the twins and LoRA adapters, attached after sharding, stay plain tensors replicated from rank 0 (the
        shards' mesh dimension is named ``fsdp``, which peft reads as FSDP: adapters of the full projection, not
        of a tensor-parallel shard). Without a mesh (one process, DDP) every rank loads the whole teacher.

        Raises:
            ValueError: LoRA ``target_modules`` the teacher does not have (before the DoF estimate).
            ValueError: the planner's settings do not fit the student (before the teacher loads); ``exact_heads``
                outside the teacher's layers or KV heads, or a probe without documents (before the DoF estimate).
        """
        if self.student is not None:
            return
        trainer = self._trainer
        mesh = self._lightning_device_mesh()
        mesh = None if mesh is None else fsdp_mesh(data_parallel(mesh))
        spec = StudentSpec(self.teacher_name, self.share_kv_maps, sliding_window=self.sliding_window)
        self.planner.check(spec)
        teacher = self._load_teacher(mesh)
        self.check_teacher(teacher)
        datamodule = getattr(trainer, "datamodule", None)  # the probe's documents; checked before the DoF estimate
        sw = self.sliding_window
        exact = resolve_exact_heads(
            self.exact_heads, teacher, self.tokenizer, datamodule, self.softmax_layers, (sw.window, sw.sink_tokens)
        )
        self.plan = self.planner.plan(teacher, trainer, spec)
        if mesh is not None:
            from lit_dof.teacher.sharded import reshard

            reshard(teacher)  # the root keeps its parameters gathered after the DoF forwards
        seed = torch.initial_seed() if self.seed is None else self.seed
        self.student = linearize(
            teacher,
            self.feature_map,
            self.plan.feature_dims,
            softmax_layers=self.softmax_layers,
            exact_heads=exact,
            share_kv_maps=self.share_kv_maps,
            chunk_size=self.chunk_size,
            seed=seed,
            sliding_window=self.sliding_window,
        )
        self.kernels.apply(self.student)
        self.student.requires_grad_(False)
        if self.lora is not None:
            self._check_lora_strategy()
            add_lora(self.student.model, self.lora)
        for name, parameter in self.trainable_parameters():
            parameter.requires_grad_(True)
        if mesh is not None:
            self._replicate_twins(mesh)

    def _load_teacher(self, mesh) -> torch.nn.Module:
        """The frozen teacher in :meth:`resolved_teacher_dtype` (sets ``self.tokenizer``): whole on every rank
        without a mesh, sharded over the mesh's data-parallel group with one (lit_dof.teacher.sharded)."""
        dtype = self.resolved_teacher_dtype()
        if mesh is None:
            from lit_dof.teacher.loading import load_teacher

            teacher, self.tokenizer = load_teacher(self.teacher_name, dtype=dtype)
            return teacher
        from lit_dof.teacher.sharded import load_sharded_teacher

        device = self._trainer.strategy.root_device if self._trainer is not None else "cpu"
        teacher, self.tokenizer = load_sharded_teacher(self.teacher_name, mesh, dtype=dtype, device=device)
        return teacher

    def check_teacher(self, teacher: torch.nn.Module) -> None:
        """Validate this module's settings against the loaded teacher before any expensive work (the DoF
        estimate, the twins). Subclasses extend it; the base checks the LoRA ``target_modules``.

        Raises:
            ValueError: a LoRA target the teacher does not have (lit_dof.students.lora.check_targets).
        """
        if self.lora is not None:
            check_targets(teacher, self.lora)

    def resolved_teacher_dtype(self) -> torch.dtype:
        """The teacher's parameter dtype: ``teacher_dtype``, with ``"auto"`` read from ``trainer.precision``
        (float32 without a trainer)."""
        precision = self._trainer.precision if self._trainer is not None else None
        return resolve_dtype(self.teacher_dtype, precision)

    def _check_lora_strategy(self) -> None:
        """LoRA adapters get gradients only in the end-to-end tail: DDP must be told that parameters may go
        unused, or its reducer fails at the second layer-wise step."""
        from lightning.pytorch.strategies import DDPStrategy

        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, DDPStrategy) and not getattr(strategy, "_ddp_kwargs", {}).get("find_unused_parameters"):
            raise ValueError(
                "LoRA under DDP needs find_unused_parameters: the adapters train in the end-to-end tail "
                "only; set --trainer.strategy.init_args.find_unused_parameters=true"
            )

    def _lightning_device_mesh(self):
        try:
            return self.device_mesh  # set by ModelParallelStrategy (FSDP2)
        except (AttributeError, RuntimeError):
            return None

    def _replicate_twins(self, dp) -> None:
        """FSDP2: the teacher is sharded at its decoder layers and root (lit_dof.teacher.sharded.shard_teacher);
        the twins and LoRA adapters, attached after sharding, are plain tensors that FSDP does not manage (they are
        small and the twins' losses run outside the layers' forward). Broadcast them from the group's rank 0 here;
        their gradients are all-reduced in :meth:`on_after_backward`."""
        named_twins = [(n, p) for n, p in self.student.named_parameters() if ".lit_dof." in n or ".lora_" in n]
        # Sorted by name: the same order on every rank.
        self._replicated = [p for _, p in sorted(named_twins, key=lambda item: item[0]) if p.requires_grad]
        self._replicated_group = dp.get_group()
        twin_states = sorted(
            [(n, t) for n, t in [*named_twins, *self.student.named_buffers()] if ".lit_dof." in n or ".lora_" in n],
            key=lambda item: item[0],
        )
        twins_now = [t.detach() for _, t in twin_states]
        coalesced(twins_now, torch.distributed.broadcast, group_src=0, group=self._replicated_group)

    def on_after_backward(self) -> None:
        """All-reduce (mean) the replicated twins' gradients over the data-parallel group (FSDP2 only)."""
        replicated = [p for p in getattr(self, "_replicated", ()) if p.grad is not None]
        if replicated and torch.distributed.is_initialized():
            coalesced([p.grad for p in replicated], all_reduce_mean, group=self._replicated_group)

    def trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) pairs this phase trains (default: the linear twins' feature maps, and their far-term
        weights where they have a sliding window, and LoRA adapters when ``lora`` is set; not the unused maps of
        window-only twins)."""
        chosen = {id(p) for _, p in trainable_parameters(self.student, "feature_maps")}
        return [(n, p) for n, p in self.student.named_parameters() if id(p) in chosen or ".lora_" in n]

    # -- checkpoints: only what training changes -------------------------------------------------------------
    def state_dict(self, *args, **kwargs) -> dict:
        """``nn.Module.state_dict`` without the frozen teacher.

        The teacher's weights are reloaded from the teacher on resume (a 135M teacher would add 540 MB to every
        checkpoint, an 8B one 32 GB). Every checkpoint path goes through here: Lightning's ``torch.save`` under
        DDP and, under ModelParallelStrategy, both the sharded (DCP) save and the keys its load asks for
        (``get_model_state_dict``), so a twins-only checkpoint loads there too.

        Args:
            *args: those of :meth:`torch.nn.Module.state_dict`.
            **kwargs: those of :meth:`torch.nn.Module.state_dict`.

        Returns:
            the linear twins' entries (``.lit_dof.``) and the parameters this phase trains.
        """
        state = super().state_dict(*args, **kwargs)
        if self.student is None:
            return state
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        trainable = {f"{prefix}student.{name}" for name, _ in self.trainable_parameters()}
        for key in [k for k in state if k.startswith(prefix) and ".lit_dof." not in k and k not in trainable]:
            del state[key]
        return state

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Record the student's per-layer feature dimensions M, its feature-map factory and its planner's allocation
        settings in the checkpoint."""
        from lit_dof.pipeline.resume import factory_name, planner_settings

        checkpoint["lit_dof_feature_dims"] = self.student.feature_dims
        checkpoint["lit_dof_feature_map"] = factory_name(self.feature_map)  # not a hyperparameter (a factory)
        checkpoint["lit_dof_planner"] = planner_settings(self.planner)  # nor is the planner (an object)
        checkpoint["lit_dof_tokens_seen"] = self.tokens_seen  # rank 0's: every rank's blocks have one size

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Check that the rebuilt student has the checkpoint's feature dimensions; restore :attr:`tokens_seen`.

        Raises:
            ValueError: the dimensions differ (another DoF estimate): resume with the planner's ``report_path``.
        """
        dims = checkpoint.get("lit_dof_feature_dims")
        if dims is not None and self.student is not None and dims != self.student.feature_dims:
            raise ValueError(
                f"checkpoint feature dims {dims} differ from the rebuilt student's {self.student.feature_dims}: "
                "resume with the same DoF settings or pass model.init_args.planner.init_args.report_path=<run>/dof.json"
            )
        self.tokens_seen = int(checkpoint.get("lit_dof_tokens_seen", 0))

    # -- validation: held-out perplexity of teacher and student --------------------------------------------
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        """Update the student's perplexity and the teacher's per-token NLL (the teacher's computed once per batch)."""
        ids = batch["input_ids"]
        logits = self.student(ids, use_cache=False).logits[:, :-1].float()
        with fp32_region():  # the metric's softmax and sums in float32 under any precision
            self.val_ppl_student.update(logits, ids[:, 1:])
        if batch_idx not in self._teacher_val_cache:  # validation data is deterministic: one teacher pass
            with self.student.teacher_mode():
                teacher_logits = self.student(ids, use_cache=False).logits[:, :-1].float()
            self._teacher_val_cache[batch_idx] = self._nll(teacher_logits, ids[:, 1:])
        nll_sum, count = self._teacher_val_cache[batch_idx]
        self.val_nll_teacher.update(torch.tensor(nll_sum / count, dtype=torch.float32), count)

    @staticmethod
    @fp32_region()
    def _nll(logits: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
        )
        return float(nll), target.numel()

    def on_validation_epoch_start(self) -> None:
        """Keep the metrics' states in float32 under ``bf16-true``/``16-true``."""
        # bf16-true / 16-true convert the whole module, the metrics' states included: sum in float32 again.
        self.val_ppl_student.set_dtype(torch.float32)
        self.val_nll_teacher.set_dtype(torch.float32)

    def on_validation_epoch_end(self) -> None:
        """Log ``val/ppl_student`` and ``val/ppl_teacher`` (exact over ranks) and reset the metrics."""
        # Each rank scored its share of the validation blocks; the metrics sum NLL and token counts over ranks
        # when computed, so both perplexities are the exact global ones (no average of per-rank perplexities).
        self.log("val/ppl_student", self.val_ppl_student.compute(), prog_bar=True)
        self.val_ppl_student.reset()
        if self.val_nll_teacher.update_count:
            self.log("val/ppl_teacher", self.val_nll_teacher.compute().exp(), prog_bar=True)
        self.val_nll_teacher.reset()

    # -- export -------------------------------------------------------------------------------------------
    def on_fit_end(self) -> None:
        """Export the student (full weights, LoRA merged) and its tokenizer to ``export_dir`` on rank 0
        (default ``<log_dir>/student``; ``""``: no export)."""
        if self.export_dir == "" or self.student is None:
            return
        log_dir = self.trainer.log_dir  # a collective under DDP: every rank asks
        target = self.export_dir or os.path.join(log_dir or ".", "student")
        state_dict = None
        if getattr(self, "_replicated_group", None) is not None:  # FSDP2: gather full weights (collective)
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state_dict = get_model_state_dict(
                self.student, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        if self.trainer.is_global_zero:
            if has_adapters(self.student.model):  # plain weights: the exported student loads without peft
                state_dict = merged_state_dict(self.student, state_dict)
            self.student.save_pretrained(target, state_dict=state_dict)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(target)
            self._describe_export(target)
        self.exported_to = target

    def _describe_export(self, target: str) -> None:
        """Rewrite the exported student's model card (atomically) with what this run knows beyond its files: the
        DoF report (``dof.json`` sits in the log directory, which ``export_dir`` may not be next to), the
        allocation strategy (:attr:`plan`) and the training record (lit_dof.pipeline.training_record: recipe, steps,
        tokens, data, LoRA tail, validation perplexities; kept in the folder as ``lit_dof_training.json``)."""
        from lit_dof.pipeline.training_record import training_record

        report = self.plan.report.to_dict() if self.plan.report is not None else None
        write_model_card(target, dof=report, strategy=self.plan.strategy, training=training_record(self))
