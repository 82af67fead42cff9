"""From the objects of a ``lit-dof fit`` command line to a printed memory plan (:mod:`lit_dof.pipeline.plan` counts).

``lit-dof plan`` (:func:`lit_dof.pipeline.cli.plan_main`) instantiates the fit's model and data module through the
fit's own parser (:func:`lit_dof.pipeline.cli.parse_fit_config`; a model loads its teacher only at
``configure_model``, so nothing heavy happens). :func:`plan_config` builds the teacher on the meta device and asks
the fit's objects for what decides memory (:func:`settings_from_config`): the planner its feature dims
(:meth:`~lit_dof.pipeline.planner.FeatureDimPlanner.outlook`, the fit's own allocation), the LoRA settings their
adapters' bytes; the layer loss, the feature map and the sliding window are asked by :func:`plan_phases` for their
terms. :func:`format_plan` prints the phases.
"""

from __future__ import annotations

from torch import nn

from lit_dof.pipeline.allocation import AttentionShape
from lit_dof.pipeline.architecture import Architecture, PlanError, architecture, resolve_teacher_config
from lit_dof.pipeline.exact_heads import RetrievalHeads
from lit_dof.pipeline.plan import GIB, Phase, RunSettings, plan_phases
from lit_dof.pipeline.planner import StudentSpec


def settings_from_config(config, teacher: nn.Module) -> RunSettings:
    """:class:`RunSettings` of a ``lit-dof fit`` command line, from the objects the fit builds.

    Args:
        config: the fit parser's namespace with the model and data module instantiated
            (:func:`lit_dof.pipeline.cli.parse_fit_config`); ``trainer`` holds the trainer's settings.
        teacher: the teacher built on the meta device (the planner's layout; LoRA is injected into it to count its
            adapters, so pass a copy you no longer need).

    Raises:
        PlanError: ``--trainer.devices`` not a count of GPUs (``-1``/``"auto"`` depend on the machine), a model that
            is not a distillation phase (a :class:`~lit_dof.pipeline.layerwise.LayerwiseDistillation`), a data module
            without ``batch_size``/``seq_len``/``val_blocks``, or settings its planner refuses.
    """
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    from lit_dof.pipeline.layerwise import LayerwiseDistillation
    from lit_dof.precision import resolve_dtype

    trainer, model, data = config.trainer, config.model, config.data
    if not isinstance(model, LayerwiseDistillation):
        raise PlanError(
            "lit-dof plan covers the distillation phases (LayerwiseDistillation and its subclasses, e.g. "
            f"DirectDistillation), not {type(model).__name__}"
        )
    accelerator = str(trainer.accelerator or "auto")
    accelerator = "gpu" if accelerator == "auto" else accelerator
    devices = trainer.devices
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    elif str(devices) in ("-1", "auto"):
        if accelerator != "cpu":
            raise PlanError(
                f"--trainer.devices {devices} means every GPU of the machine the run starts on: "
                "give the count to plan for, e.g. --trainer.devices 8"
            )
        devices = 1
    elif isinstance(devices, str) and "," in devices:
        devices = len([x for x in devices.split(",") if x.strip()])
    strategy = trainer.strategy  # an instance once instantiated, or a name of Lightning's registry
    sharded = isinstance(strategy, (ModelParallelStrategy, FSDPStrategy)) or str(strategy).startswith("fsdp")
    shape = AttentionShape.of(teacher)
    try:
        model.planner.check(StudentSpec(model.teacher_name, model.share_kv_maps, model.sliding_window))
        dims = model.planner.outlook(shape)
        batch_size, seq_len, val_blocks = data.batch_size, data.seq_len, data.val_blocks
    except (ValueError, OSError, AttributeError) as exc:
        raise PlanError(f"{type(exc).__name__}: {exc}") from exc
    linear = None
    if dims.dims is not None:
        linear = [max(m) if isinstance(m, list) else m for m, ok in zip(dims.dims, shape.linearizable) if ok]
    return RunSettings(
        teacher=model.teacher_name,
        accelerator=accelerator,
        devices=int(devices),
        num_nodes=int(trainer.num_nodes or 1),
        sharded=sharded,
        teacher_dtype=resolve_dtype(model.teacher_dtype, trainer.precision),
        batch_size=batch_size,
        seq_len=seq_len,
        query_rows=model.query_rows,
        loss=model.layer_loss,
        feature_map=model.feature_map,
        feature_dims=linear,
        budget=dims.budget,
        max_dim=dims.max_dim,
        share_kv_maps=model.share_kv_maps,
        chunk_size=model.chunk_size,
        sliding_window=model.sliding_window,
        end_to_end_fraction=model.end_to_end_fraction,
        dof_samples=dims.estimate_samples,
        dof_pooling=dims.estimate_pooling,
        validate=trainer.limit_val_batches != 0 and val_blocks > 0,
        export=model.export_dir != "",
        accumulate=int(trainer.accumulate_grad_batches or 1),
        layer_backward=model.layer_backward,
        lora_rank=model.lora.rank if model.lora else 0,
        lora_bytes=model.lora.parameter_bytes(teacher) if model.lora else 0,
        probe_block=model.exact_heads.block if isinstance(model.exact_heads, RetrievalHeads) else 0,
    )


def plan_config(config) -> tuple[Architecture, RunSettings, list[Phase]]:
    """The plan of a ``fit`` command line: the teacher's meta-device architecture, the run's settings, the phases.

    Args:
        config: the fit parser's namespace with the model and data module instantiated
            (:func:`lit_dof.pipeline.cli.parse_fit_config`).

    Raises:
        PlanError: as :func:`settings_from_config` and :func:`~lit_dof.pipeline.architecture.resolve_teacher_config`.
    """
    from lit_dof.teacher.sharded import empty_causal_lm

    teacher_config = resolve_teacher_config(config.model.teacher_name)
    arch = architecture(teacher_config)
    run = settings_from_config(config, empty_causal_lm(teacher_config))
    return arch, run, plan_phases(arch, run)


def format_plan(arch: Architecture, run: RunSettings, phases: list[Phase]) -> str:
    """The printed plan: the run, one block per phase (its terms, device and host totals, tokens per step),
    and the last line ``plan peak_gpu_gib=<x> host_gib=<y>`` (GiB = 2³⁰ bytes; peaks over the phases that run;
    ``peak_gpu_gib`` is 0 for a CPU run)."""
    where = "FSDP2-sharded" if run.sharded else "replicated"
    rows = "all" if run.query_rows is None else run.query_rows
    if run.feature_dims is None:
        dims = f"{run.budget} on average, up to {run.max_dim} (after the DoF estimate)"
    elif len(set(run.feature_dims)) == 1:
        dims = f"{run.feature_dims[0]} per layer"
    else:
        dims = f"{min(run.feature_dims)} to {max(run.feature_dims)}, {run.budget} on average"
    window = run.sliding_window
    dtype = str(run.teacher_dtype).removeprefix("torch.")
    attention = (
        f"; sliding window {window.window} + {window.sink_tokens} sink tokens + linear far term"
        if window.enabled
        else "; pure linear attention"
    )
    lines = [
        (
            f"teacher {run.teacher}: {arch.params / 1e9:.3f} B parameters, {arch.num_layers} layers "
            f"({arch.linear_layers} linearised), {arch.heads} heads / {arch.kv_heads} KV heads of {arch.head_dim}, "
            f"{dtype}"
        ),
        (
            f"run: {run.world_size} rank(s) ({run.devices} {run.accelerator} x {run.num_nodes} node(s)), "
            f"teacher {where}; B {run.batch_size} x T {run.seq_len} tokens per rank, {rows} query rows, "
            f"{run.loss.name} loss, feature dims {dims}{attention}"
        ),
    ]
    for phase in phases:
        state = "" if phase.runs else " (not in this run)"
        tokens = f", {phase.tokens} tokens/step" if phase.tokens else ""
        lines.append(
            f"phase {phase.name}{state}: device {_gib(phase.device_total())}, host {_gib(phase.host_total())}{tokens}"
        )
        for where_, terms in (("device", phase.device), ("host", phase.host)):
            lines += [f"  {where_:6s} {term:40s} {_gib(size)}" for term, size in terms.items() if size]
    running = [p for p in phases if p.runs] or phases
    gpu = max(p.device_total() for p in running) / GIB if run.on_gpu else 0.0
    host = max(p.host_total() for p in running) / GIB
    lines.append(f"plan peak_gpu_gib={gpu:.2f} host_gib={host:.2f}")
    return "\n".join(lines)


def _gib(size: int) -> str:
    return f"{size / GIB:8.3f} GiB"
