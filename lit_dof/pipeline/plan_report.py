"""From a parsed ``lit-dof fit`` config to a printed memory plan (:mod:`lit_dof.pipeline.plan` does the counting).

:func:`settings_from_config` reads what matters for memory from the namespace the ``fit`` parser produces
(nothing is instantiated), :func:`plan_config` adds the teacher's meta-device architecture and the phases,
:func:`format_plan` prints them; ``lit-dof plan`` (:func:`lit_dof.pipeline.cli.plan_main`) is the three in a row.
"""

from __future__ import annotations

import os

from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.pipeline.plan import (
    GIB,
    Architecture,
    Phase,
    PlanError,
    RunSettings,
    architecture,
    plan_phases,
    resolve_teacher_config,
)
from lit_dof.students.layer_losses import LEGACY_LOSS_NAMES, layer_loss_name
from lit_dof.teacher import DEFAULT_TEACHER


def settings_from_config(config) -> RunSettings:
    """:class:`RunSettings` from a parsed ``lit-dof fit`` config (the jsonargparse namespace of the ``fit``
    parser: ``trainer``, ``model`` with its ``planner``, ``data``), without instantiating anything.

    Raises:
        PlanError: ``--trainer.devices`` not a count of GPUs (``-1``/``"auto"`` depend on the machine), or a
            model class that is not a training phase.
    """
    from lit_dof.precision import resolve_dtype

    trainer, model = config.trainer, config.model
    margs, dargs = _args(model), _args(config.data)
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
    strategy = trainer.strategy
    name = getattr(strategy, "class_path", None) or str(strategy)
    sharding = ("ModelParallelStrategy", "ShardedDataParallelStrategy", "FSDPStrategy")
    sharded = name.rsplit(".", 1)[-1] in sharding or name.startswith("fsdp")
    class_path = getattr(model, "class_path", "")
    if not class_path.endswith(("LayerwiseDistillation", "DirectDistillation")):
        raise PlanError(
            f"lit-dof plan covers the distillation phases (LayerwiseDistillation, DirectDistillation), "
            f"not {class_path or 'a model without class_path'}"
        )
    planner = margs.get("planner")
    pargs = _args(planner)
    fixed = str(getattr(planner, "class_path", "")).endswith("FixedPlanner")  # else a DoFPlanner: an estimate
    strategy = "fix" if fixed else pargs.get("strategy", "dof")
    budget = pargs.get("feature_dim") if fixed else pargs.get("budget")
    report_path = None if fixed else pargs.get("report_path")
    feature_dims = None
    if report_path and os.path.isfile(report_path) and strategy in ("dof", "dof_clip", "fix"):
        from lit_dof.dof import DoFReport

        feature_dims = DoFReport.load(report_path).feature_dims(strategy)
    cap = {"fix": 1, "dof_clip": 1}.get(strategy, 3)  # dof: a layer's M up to ≈ 3C (2.4C on SmolLM2)
    direct = class_path.endswith("DirectDistillation")
    loss = layer_loss_name(margs.get("loss", "softmax"))
    if not direct and loss not in LEGACY_LOSS_NAMES:
        raise PlanError(f"lit-dof plan knows the memory of the {', '.join(LEGACY_LOSS_NAMES)} layer losses, not {loss}")
    window = margs.get("sliding_window") or SlidingWindow()
    window = window if isinstance(window, SlidingWindow) else SlidingWindow.from_dict(vars(window))
    return RunSettings(
        teacher=str(margs.get("teacher", DEFAULT_TEACHER)),
        accelerator=accelerator,
        devices=int(devices),
        num_nodes=int(trainer.num_nodes or 1),
        sharded=sharded,
        teacher_dtype=resolve_dtype(margs.get("teacher_dtype", "auto"), trainer.precision),
        batch_size=int(dargs.get("batch_size", 1)),
        seq_len=int(dargs.get("seq_len", 512)),
        query_rows=margs.get("query_rows"),
        loss=loss,
        feature_dims=feature_dims,
        budget=budget,
        max_dim=None if budget is None else cap * budget,
        max_ratio=cap,
        maps_per_layer="kv" if margs.get("share_kv_maps", True) else "query",
        layer_backward=bool(margs.get("layer_backward", True)),
        window=window.window,
        sink_tokens=window.sink_tokens,
        chunk_size=int(margs.get("chunk_size", 64) or 64),
        finetune_fraction=1.0 if direct else float(margs.get("finetune_fraction", 0.0)),
        dof_enabled=not fixed and not report_path,
        dof_samples=int(pargs.get("num_samples", 1024)),
        dof_batches=int(pargs.get("num_batches", 8)),
        dof_pooling=pargs.get("pooling", "query_head"),
        validate=trainer.limit_val_batches != 0 and int(dargs.get("val_blocks", 1)) > 0,
        export=margs.get("export_dir") != "",
        accumulate=int(trainer.accumulate_grad_batches or 1),
        **_lora_settings(margs.get("lora")),
    )


def _lora_settings(lora) -> dict:
    """``lora_rank`` and ``lora_targets`` of a config's ``model.lora`` (a mapping, a LoRA, or None)."""
    if lora is None:
        return {}
    get = lora.get if isinstance(lora, dict) else lambda key, default=None: getattr(lora, key, default)
    targets = get("target_modules") or ["q_proj", "k_proj", "v_proj", "o_proj"]
    return {"lora_rank": int(get("rank", 8)), "lora_targets": tuple(targets)}


def plan_config(config) -> tuple[Architecture, RunSettings, list[Phase]]:
    """The plan of a parsed ``fit`` config: its settings, the teacher's meta-device architecture, the phases.

    Raises:
        PlanError: as :func:`settings_from_config` and :func:`resolve_teacher_config`.
    """
    run = settings_from_config(config)
    arch = architecture(resolve_teacher_config(run.teacher))
    return arch, run, plan_phases(arch, run)


def _args(group) -> dict:
    init = getattr(group, "init_args", None)
    return dict(vars(init)) if init is not None else {}


def format_plan(arch: Architecture, run: RunSettings, phases: list[Phase]) -> str:
    """The printed plan: the run, one block per phase (its terms, device and host totals, tokens per step),
    and the last line ``plan peak_gpu_gib=<x> host_gib=<y>`` (GiB = 2³⁰ bytes; peaks over the phases that run;
    ``peak_gpu_gib`` is 0 for a CPU run)."""
    where = "FSDP2-sharded" if run.sharded else "replicated"
    rows = "all" if run.query_rows is None else run.query_rows
    dims = "from the DoF report" if run.feature_dims else f"budget {run.budget or arch.head_dim}"
    dtype = str(run.teacher_dtype).removeprefix("torch.")
    attention = (
        f"; sliding window {run.window} + {run.sink_tokens} sink tokens + linear far term"
        if run.window
        else "; pure linear attention"
    )
    lines = [
        (f"teacher {run.teacher}: {arch.params / 1e9:.3f} B parameters, {arch.num_layers} layers "
         f"({arch.linear_layers} linearised), {arch.heads} heads / {arch.kv_heads} KV heads of {arch.head_dim}, "
         f"{dtype}"),
        (f"run: {run.world_size} rank(s) ({run.devices} {run.accelerator} x {run.num_nodes} node(s)), teacher {where}; "
         f"B {run.batch_size} x T {run.seq_len} tokens per rank, {rows} query rows, {run.loss} loss, "
         f"feature dims {dims}{attention}"),
    ]  # fmt: skip  # compact list
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
