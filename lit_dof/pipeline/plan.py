"""Memory plan of a ``lit-dof fit`` run before it starts: bytes per device and host RAM per rank, per phase.

:func:`plan_phases` turns the teacher's sizes (:class:`~lit_dof.pipeline.architecture.Architecture`, read from
its meta-device model without weights: :mod:`lit_dof.pipeline.architecture`) and the run's settings
(:class:`RunSettings`, usually from the parsed ``fit`` config:
:func:`lit_dof.pipeline.plan_report.settings_from_config`) into one :class:`Phase` per stage of the run. Every
figure is a closed-form count of the tensors the code keeps alive (see each term's comment), in bytes, not a
measurement; ``docs/scale.md`` compares it with measured peaks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from lit_dof.attention import CausalLinearAttention, FeatureMapFactory, SlidingWindow
from lit_dof.pipeline.architecture import Architecture, PlanError
from lit_dof.students.layer_losses import LayerLoss, LayerStep
from lit_dof.students.query_rows import StratifiedRows, scored_rows

GIB = 1024**3
RUNTIME_DEVICE_BYTES = GIB  # CUDA context, NCCL buffers, allocator slack (not counted on a CPU device)
RUNTIME_HOST_BYTES = 3 * GIB // 2  # Python, torch, transformers, Lightning, tokenizer, data loader

_DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


@dataclass(frozen=True)
class RunSettings:
    """What a ``fit`` run decides about memory (sizes in tokens, counts per rank), read from the objects the fit
    builds (:func:`lit_dof.pipeline.plan_report.settings_from_config`).

    Attributes:
        teacher: the teacher's name. accelerator: ``"gpu"``/``"cuda"`` or ``"cpu"``. devices, num_nodes: per
            node / nodes. sharded: FSDP2 (ModelParallelStrategy) shards the teacher; else it is replicated.
        teacher_dtype: the teacher's parameter dtype. batch_size, seq_len: per-rank batch B and block T.
        query_rows: R scored rows per sequence (``None``: all T; a StratifiedRows: its count).
        loss: the layer-wise phase's :class:`LayerLoss`, asked for its memory (:meth:`LayerLoss.step_bytes`).
        feature_map: the twins' feature-map factory (the twins are built on the meta device and measured).
        feature_dims: M per linear layer, the planner's own allocation (``None``: ``budget`` on average, up to
            ``max_dim`` in one layer, after the fit's DoF estimate); a layer with one M per KV head counts its
            largest. budget: the mean M. max_dim: the largest M one layer may get.
        share_kv_maps: one feature map per KV head (else per query head). chunk_size: the kernels' query chunk C.
        sliding_window: the twins' window options (asked for the band's memory).
        end_to_end_fraction: share of steps trained end to end. dof_samples, dof_pooling: the DoF estimate the
            fit makes before it allocates (``dof_samples`` 0: none). validate, export: whether those phases run.
        accumulate: gradient-accumulation micro-batches per optimizer step.
        layer_backward: the layer-wise phase differentiates each layer's loss as soon as it is computed
            (``LayerwiseDistillation.layer_backward``): one layer's loss graph alive at a time, not all of them.
        lora_rank: r of the LoRA adapters (0: none); lora_bytes: their float32 parameters (replicated on every
            rank, trained in the tail with Adam), counted on the meta-device teacher.
        probe_block: tokens per item of the exact heads' retrieval-head probe before the DoF estimate
            (:class:`~lit_dof.pipeline.exact_heads.RetrievalHeads`; 0: no probe, or a
            :class:`~lit_dof.pipeline.exact_heads.LongRangeHeads`, whose probe holds about one teacher forward of
            ``block`` tokens, its scores ``Hq · 256 · block`` floats at a time: not a phase of its own).
    """

    teacher: str
    accelerator: str
    devices: int
    num_nodes: int
    sharded: bool
    teacher_dtype: torch.dtype
    batch_size: int
    seq_len: int
    query_rows: int | StratifiedRows | None
    loss: LayerLoss
    feature_map: FeatureMapFactory
    feature_dims: list[int] | None
    budget: int
    max_dim: int
    share_kv_maps: bool
    chunk_size: int
    sliding_window: SlidingWindow
    end_to_end_fraction: float
    dof_samples: int
    dof_pooling: str
    validate: bool
    export: bool
    accumulate: int
    layer_backward: bool
    lora_rank: int
    lora_bytes: int
    probe_block: int = 0

    @property
    def world_size(self) -> int:
        """Ranks in the run (devices × nodes)."""
        return self.devices * self.num_nodes

    @property
    def on_gpu(self) -> bool:
        """Whether the run's devices are GPUs (any accelerator but ``cpu``)."""
        return self.accelerator != "cpu"


@dataclass
class Phase:
    """One stage's memory, in bytes per rank: ``device`` on the GPU (the CPU when the run is on CPU), ``host``
    in RAM besides it; ``tokens`` per optimizer step (all ranks) where the phase trains."""

    name: str
    device: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    runs: bool = True

    def device_total(self) -> int:
        """Bytes per device, summed over the terms."""
        return sum(self.device.values())

    def host_total(self) -> int:
        """Host RAM bytes per rank, summed over the terms."""
        return sum(self.host.values())


def plan_phases(arch: Architecture, run: RunSettings) -> list[Phase]:
    """The memory of each stage of the run, from ``arch`` and ``run`` alone (closed form, bytes per rank).

    Phases: ``load`` (FSDP only: rank 0 holds the whole teacher on the host while it broadcasts the shards;
    lit_dof.teacher.sharded), ``probe`` (the exact heads' retrieval-head probe, when the fit has one), ``dof``
    (capture + estimate: on the sharded teacher under FSDP, the whole teacher otherwise), ``layerwise`` (teacher
    forward stopped after the last twin, all layers' q/k kept, one layer's loss graph alive at a time — every layer's
    with ``layer_backward`` off), ``tail`` (end-to-end logit distillation: backward through the whole student),
    ``validate`` (teacher and student logits), ``export`` (full weights on rank 0). On a CPU run the device terms are
    host RAM: ``host`` then holds them too.

    Raises:
        PlanError: non-positive sizes.
    """
    if run.devices < 1 or run.num_nodes < 1 or run.batch_size < 1 or run.seq_len < 1:
        raise PlanError(
            f"devices, num_nodes, batch_size and seq_len must be >= 1, got {run.devices}, "
            f"{run.num_nodes}, {run.batch_size}, {run.seq_len}"
        )
    a, b = arch, _DTYPE_BYTES[run.teacher_dtype]
    B, T, W, L = run.batch_size, run.seq_len, run.world_size, a.linear_layers
    R = scored_rows(T, run.query_rows)
    Hq, Hk, d, h, ffn, V = a.heads, a.kv_heads, a.head_dim, a.hidden, a.intermediate, a.vocab  # ffn: I, the MLP width
    dims = run.feature_dims or [run.budget] * L  # per linear layer
    max_m = max(run.feature_dims) if run.feature_dims else run.max_dim
    tokens = B * T

    @lru_cache(maxsize=None)
    def twin(m: int) -> CausalLinearAttention:  # one layer's twin of feature dim m, measured, never run
        build = functools.partial(CausalLinearAttention.from_factory, run.feature_map, d, m, Hq, Hk)
        kwargs = {"share_kv_maps": run.share_kv_maps, "chunk_size": run.chunk_size}
        try:
            with torch.device("meta"):
                return build(**kwargs)
        except (RuntimeError, NotImplementedError):  # a map whose initialisation computes on the CPU: build it there
            return build(**kwargs)

    teacher = a.params * b  # whole teacher in its dtype
    shard = -(-teacher // W) if run.sharded else teacher
    gathered = (2 * a.layer_params + a.root_params) * b if run.sharded and W > 1 else 0  # layer + prefetch, root
    twins = sum(p.numel() * p.element_size() for m in dims for p in twin(m).parameters())  # float32 masters
    twins += run.lora_bytes
    optimizer = 3 * twins  # gradients + Adam's two moments
    # No-grad forward of one decoder layer: residual, norm, q/k/v, attention output, gate/up/act of the MLP.
    layer_act = tokens * (4 * h + (Hq + 2 * Hk) * d + 3 * ffn) * b
    if not run.on_gpu:
        layer_act += B * Hq * T * T * 4  # CPU SDPA with a mask materialises the score matrix
    logits = tokens * V * b

    phases = []
    if run.sharded:  # rank 0 loads the whole teacher (host, its dtype) and broadcasts it; the others hold shards
        load = Phase("load")
        load.device["teacher shard"] = shard
        load.host.update(
            {"teacher (whole, rank 0, while loading)": teacher, "broadcast tensor (≤ the root)": a.root_params * b}
        )
        phases.append(load)
    # -- exact heads' probe: one item at a time, eager attention returning every layer's weights (L, Hq, P, P)
    if run.probe_block:
        probe, P = Phase("probe"), run.probe_block
        held = {"teacher shard": shard, "gathered layers": gathered} if run.sharded else {"teacher (whole)": teacher}
        weights = (a.num_layers + 1) * Hq * P * P * b  # output_attentions keeps them all; one layer's scores besides
        probe.device.update({**held, "attention weights (every layer + one's scores)": weights, "logits": P * V * b})
        phases.append(probe)
    # -- DoF estimate: on the sharded teacher under FSDP, else on the whole teacher; reservoir always on the host.
    pool_heads = Hq if run.dof_pooling == "query_head" else Hk  # DoFPlanner's pooling: per query or per KV head
    reservoir = a.num_layers * pool_heads * run.dof_samples * (d * 4 + 8)
    candidates = pool_heads * (run.dof_samples + 2 * tokens) * d * 4 * 2  # one layer's offers + concat copy
    eigen = 3 * run.dof_samples**2 * 8  # one head's J x J Gram and eigenvectors, float64
    dof = Phase("dof", runs=run.dof_samples > 0)
    if run.sharded:
        dof.device.update({"teacher shard": shard, "gathered layers": gathered})
    else:
        dof.device["teacher (whole)"] = teacher
    dof.device.update({"activations (one layer, no grad)": layer_act, "logits": logits})
    dof.host.update({"q/k reservoir": reservoir, "candidates + eigen work": candidates + eigen})
    phases.append(dof)

    # -- layer-wise steps
    static = {"teacher shard": shard, "gathered layers": gathered, "twins": twins, "optimizer state": optimizer}
    gate_values = run.sliding_window.far_gate and not run.loss.needs_values  # the capture keeps v for the gates
    captured = L * B * (Hq + Hk + Hk * gate_values) * T * d * b  # q and k (v) of every twin's layer, teacher dtype
    band = run.sliding_window.activation_bytes(B, Hq, T, run.chunk_size)

    def loss_bytes(m: int):  # the layer loss's own memory terms for a twin of feature dim m
        step = LayerStep(B, Hq, Hk, T, R, d, m, B * (Hq + Hk) * T * d * b, twin(m).activation_bytes(B, T), band)
        return run.loss.step_bytes(step)

    one_loss = loss_bytes(max_m)
    one_graph, loss_now = one_loss.saved, one_loss.transient
    graphs = sum(loss_bytes(m).saved for m in dims)
    layerwise = Phase("layerwise", tokens=tokens * W * run.accumulate, runs=run.end_to_end_fraction < 1)
    layerwise.device.update(static)
    if run.layer_backward:  # one layer's graph at a time, and its gradients gathered until the surrogate backward
        layerwise.device.update(
            {"captured q/k": captured, "loss graph (one layer)": one_graph, "per-layer gradients": twins}
        )
    else:
        layerwise.device.update({"captured q/k": captured, "loss graphs (all layers)": graphs})
    layerwise.device["activations (max of forward, one loss)"] = max(layer_act, loss_now)
    phases.append(layerwise)

    # -- end-to-end tail: backward through every layer (frozen weights, twins' gradients flow through all)
    # Frozen linears save nothing; the two RMSNorms keep their float32 input (4h), the MLP's SiLU input, SiLU
    # output and up projection (3I in the teacher's dtype), the twin its values and chunked-kernel state.
    saved = tokens * (8 * h + 3 * ffn * b + Hk * d * 4)
    tail_layer = saved + twin(run.budget).activation_bytes(B, T) + band
    tail = Phase("tail", tokens=tokens * W * run.accumulate, runs=run.end_to_end_fraction > 0)
    tail.device.update(static)
    tail.device.update(
        {
            "teacher logits": logits,
            "activations (all layers)": a.num_layers * tail_layer,
            "logits + KL graph": logits + tokens * V * 4 * 6,
        }
    )
    phases.append(tail)

    # -- validation: student and teacher logits upcast, Perplexity's float32 softmax
    val = Phase("validate", runs=run.validate)
    val.device.update(
        {
            "teacher shard": shard,
            "gathered layers": gathered,
            "twins": twins,
            "activations (one layer, no grad)": layer_act,
            "logits (both, float32)": 2 * tokens * V * 4 + logits,
            "perplexity softmax": 2 * tokens * V * 4,
        }
    )
    phases.append(val)

    # -- export: rank 0 gathers the full weights to the host (FSDP) and safetensors serialises them
    export = Phase("export", runs=run.export)
    export.device.update(
        {"teacher shard": shard, "twins": twins, "gathered tensor": (a.root_params // 2) * b if run.sharded else 0}
    )
    export.host.update({"full state dict": teacher + twins, "serialisation buffer": teacher + twins})
    phases.append(export)

    for phase in phases:
        if run.on_gpu:
            phase.device["runtime (CUDA context, NCCL)"] = RUNTIME_DEVICE_BYTES
        else:  # one memory: the device terms live in host RAM
            phase.host = {**phase.device, **phase.host}
            phase.device = {}
        phase.host["runtime (python, torch, data)"] = RUNTIME_HOST_BYTES
    return phases
