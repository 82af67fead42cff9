"""Memory plan of a ``lit-dof fit`` run before it starts: bytes per device and host RAM per rank, per phase.

:func:`resolve_teacher_config` finds the teacher's architecture without weights or network (a local
directory's ``config.json``, the embedded alias's GGUF metadata or its cached conversion, or an architecture
file shipped in ``configs/models/<name>/config.json`` whose ``_name_or_path`` is the hub id);
:func:`architecture` builds the model on the meta device and reads its sizes; :func:`plan_phases` turns them
and the run's settings (:class:`RunSettings`, usually from the parsed ``fit`` config:
:func:`lit_dof.pipeline.plan_report.settings_from_config`) into one :class:`Phase` per stage of the run. Every
figure is a closed-form count of the tensors the code keeps alive (see each term's comment), in bytes, not a
measurement; ``docs/scale.md`` compares it with measured peaks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lit_dof.config_files import config_root

GIB = 1024**3
ARCHITECTURES_ENV = "LIT_DOF_ARCHITECTURES"
"""Environment variable: extra directory searched for ``<name>/config.json`` architecture files."""
RUNTIME_DEVICE_BYTES = GIB  # CUDA context, NCCL buffers, allocator slack (not counted on a CPU device)
RUNTIME_HOST_BYTES = 3 * GIB // 2  # Python, torch, transformers, Lightning, tokenizer, data loader

_DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
_LOSS_SAVED = {"softmax": 24, "l2": 32, "output": 0}  # bytes per (B, Hq, R, T) element kept for backward
_LOSS_TRANSIENT = {"softmax": 28, "l2": 40, "output": 0}  # bytes per element alive only inside one layer's loss


class PlanError(ValueError):
    """The run cannot be planned (unknown teacher architecture, devices not a count, unsupported settings)."""


def _shipped_dirs() -> list[Path]:
    dirs = [Path(os.environ[ARCHITECTURES_ENV])] if os.environ.get(ARCHITECTURES_ENV) else []
    return dirs + [config_root() / "models"]


def shipped_architecture(hub_id: str) -> Path | None:
    """The shipped ``config.json`` of ``hub_id`` (``_name_or_path`` matches), or ``None``.

    Searches ``$LIT_DOF_ARCHITECTURES`` and the shipped ``configs/models/*/config.json``
    (:func:`lit_dof.config_files.config_root`).
    """
    for root in _shipped_dirs():
        for path in sorted(root.glob("*/config.json")):
            try:
                if json.loads(path.read_text()).get("_name_or_path") == hub_id:
                    return path
            except (OSError, json.JSONDecodeError):
                continue
    return None


def resolve_teacher_config(teacher: str):
    """The teacher's ``PretrainedConfig``, read without weights.

    Order: a local directory's ``config.json``; an embedded alias (its cached float32 conversion's config, else
    the GGUF file's metadata); a ``.gguf`` file's metadata; a shipped architecture file for a hub id; the local
    Hugging Face cache (or the hub, unless ``HF_HUB_OFFLINE=1``).

    Raises:
        PlanError: nothing describes ``teacher`` (the message lists where it looked).
    """
    from transformers import AutoConfig

    from lit_dof.teacher.loading import EMBEDDED_TEACHERS, embedded_gguf_path, gguf_cache_target

    path = Path(os.path.expanduser(teacher))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PlanError(f"{path} has no config.json: not a transformers model directory")
        return AutoConfig.from_pretrained(path)
    gguf = embedded_gguf_path(teacher) if teacher in EMBEDDED_TEACHERS else path if path.suffix == ".gguf" else None
    if gguf is not None:
        if not gguf.is_file():
            raise PlanError(f"GGUF file {gguf} does not exist")
        cached = gguf_cache_target(gguf)
        if (cached / "config.json").is_file():
            return AutoConfig.from_pretrained(cached)
        return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)  # metadata only
    shipped = shipped_architecture(teacher)
    if shipped is not None:
        return AutoConfig.from_pretrained(shipped.parent)
    try:
        return AutoConfig.from_pretrained(teacher)
    except OSError as exc:
        raise PlanError(
            f"no architecture for teacher {teacher!r}: not a local directory, alias or .gguf file, no "
            f"configs/models/*/config.json with _name_or_path {teacher!r} (or in ${ARCHITECTURES_ENV}), "
            "and not in the Hugging Face cache; ship its config.json there"
        ) from exc


@dataclass(frozen=True)
class Architecture:
    """Sizes of a teacher read from its meta-device model (counts of elements, not bytes).

    Attributes:
        params: all parameters (tied ones once). layer_params: the largest decoder layer's.
        root_params: parameters outside the decoder layers (embeddings, final norm, LM head).
        num_layers, hidden, intermediate, vocab: L, h, I, V. heads, kv_heads, head_dim: Hq, Hk, d.
        linear_layers: layers that get a linear twin (sliding-window layers stay softmax).
    """

    params: int
    layer_params: int
    root_params: int
    num_layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_layers: int


def architecture(config) -> Architecture:
    """Build the causal LM of ``config`` on the meta device (no memory, no weights) and measure it.

    Raises:
        UnsupportedModelError: no supported attention layers (:func:`~lit_dof.teacher.families.attention_layers`).
    """
    from lit_dof.teacher.families import attention_layers
    from lit_dof.teacher.sharded import empty_causal_lm

    model = empty_causal_lm(config)
    layers = attention_layers(model)
    classes = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in classes] or [layers[0].module]
    per_layer = [sum(p.numel() for p in block.parameters()) for block in blocks]
    params = sum(p.numel() for p in model.parameters())
    text = config.get_text_config(decoder=True)
    hidden = getattr(text, "hidden_size", None) or text.n_embd
    intermediate = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden
    first = layers[0]
    return Architecture(params=params, layer_params=max(per_layer), root_params=params - sum(per_layer),
                        num_layers=len(layers), hidden=hidden, intermediate=intermediate, vocab=text.vocab_size,
                        heads=first.num_heads, kv_heads=first.num_kv_heads, head_dim=first.head_dim,
                        linear_layers=sum(layer.linearizable for layer in layers))  # fmt: skip  # packed args


@dataclass(frozen=True)
class RunSettings:
    """What a ``fit`` config decides about memory (sizes in tokens, counts per rank).

    Attributes:
        teacher: the teacher's name. accelerator: ``"gpu"``/``"cuda"`` or ``"cpu"``. devices, num_nodes: per
            node / nodes. sharded: FSDP2 (ModelParallelStrategy) shards the teacher; else it is replicated.
        teacher_dtype: the teacher's parameter dtype. batch_size, seq_len: per-rank batch B and block T.
        query_rows: R scored rows per sequence (``None``: all T). loss: ``softmax``/``l2``/``output``.
        feature_dims: M per linear layer (``None``: ``budget`` on average, up to ``max_dim`` in one layer).
        budget: mean M (the planner's C). max_dim: the largest M one layer may get (``None``: ``max_ratio`` ×
            the budget, the head size when ``budget`` is ``None``).
        maps_per_layer: ``"kv"`` (one map per KV head) or ``"query"``.
        finetune_fraction: share of steps in the end-to-end tail. dof_enabled, dof_samples, dof_batches,
            dof_pooling: the DoF estimate. validate, export: whether those phases run.
        accumulate: gradient-accumulation micro-batches per optimizer step.
        layer_backward: the layer-wise phase differentiates each layer's loss as soon as it is computed
            (``LayerwiseDistillation.layer_backward``): one layer's loss graph alive at a time, not all of them.
        window, sink_tokens: the sliding-window twin's exact window w and sink count s (0: pure linear
            attention); chunk_size: its query chunk C (the band of exact logits is C + w − 1 keys wide).
        lora_rank: r of the LoRA adapters (0: none); lora_targets: the projections that get them (float32 A and B,
            replicated on every rank, trained in the tail with Adam).
    """

    teacher: str
    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    sharded: bool = False
    teacher_dtype: torch.dtype = torch.float32
    batch_size: int = 1
    seq_len: int = 512
    query_rows: int | None = None
    loss: str = "softmax"
    feature_dims: list[int] | None = None
    budget: int | None = None
    max_dim: int | None = None
    max_ratio: int = 1
    maps_per_layer: str = "kv"
    finetune_fraction: float = 0.0
    dof_enabled: bool = True
    dof_samples: int = 1024
    dof_batches: int = 8
    dof_pooling: str = "query_head"
    validate: bool = True
    export: bool = True
    accumulate: int = 1
    layer_backward: bool = True
    window: int = 0
    sink_tokens: int = 0
    chunk_size: int = 64
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()

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
    lit_dof.teacher.sharded), ``dof`` (capture + estimate: on the sharded teacher under FSDP, the whole teacher
    otherwise), ``layerwise`` (teacher forward stopped after the last twin, all layers' q/k kept, one layer's loss graph
    alive at a time — every layer's with ``layer_backward`` off), ``tail`` (end-to-end logit distillation: backward
    through the whole student), ``validate`` (teacher and student logits), ``export`` (full weights on rank 0). On a CPU
    run the device terms are host RAM: ``host`` then holds them too.

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
    R = min(run.query_rows or T, T)
    Hq, Hk, d, h, ffn, V = a.heads, a.kv_heads, a.head_dim, a.hidden, a.intermediate, a.vocab  # ffn: I, the MLP width
    budget = run.budget or d
    sum_m = sum(run.feature_dims) if run.feature_dims else L * budget
    max_m = max(run.feature_dims) if run.feature_dims else (run.max_dim or run.max_ratio * budget)
    maps = Hk if run.maps_per_layer == "kv" else Hq
    tokens = B * T

    teacher = a.params * b  # whole teacher in its dtype
    shard = -(-teacher // W) if run.sharded else teacher
    gathered = (2 * a.layer_params + a.root_params) * b if run.sharded and W > 1 else 0  # layer + prefetch, root
    twins = maps * (d + 1) * sum_m * 4  # z (H, M, d) and log α (H, M) per layer, float32 master weights
    twins += _lora_bytes(a, run.lora_rank, run.lora_targets)
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
    # -- DoF estimate: on the sharded teacher under FSDP, else on the whole teacher; reservoir always on the host.
    pool_heads = Hq if run.dof_pooling == "query_head" else Hk
    reservoir = a.num_layers * pool_heads * run.dof_samples * (d * 4 + 8)
    candidates = pool_heads * (run.dof_samples + 2 * tokens) * d * 4 * 2  # one layer's offers + concat copy
    eigen = 3 * run.dof_samples**2 * 8  # one head's J x J Gram and eigenvectors, float64
    dof = Phase("dof", runs=run.dof_enabled)
    if run.sharded:
        dof.device.update({"teacher shard": shard, "gathered layers": gathered})
    else:
        dof.device["teacher (whole)"] = teacher
    dof.device.update({"activations (one layer, no grad)": layer_act, "logits": logits})
    dof.host.update({"q/k reservoir": reservoir, "candidates + eigen work": candidates + eigen})
    phases.append(dof)

    # -- layer-wise steps
    static = {"teacher shard": shard, "gathered layers": gathered, "twins": twins, "optimizer state": optimizer}
    captured = L * B * (Hq + Hk) * T * d * b  # q and k of every twin's layer, in the teacher's dtype
    elems = B * Hq * R * T  # one layer's (B, Hq, R, T) loss matrices
    feature_graph = B * Hq * (R + T) * 8  # exp(log φ) of rows and keys in float64, per feature
    graphs = L * elems * _LOSS_SAVED[run.loss] + feature_graph * sum_m
    one_graph = elems * _LOSS_SAVED[run.loss] + feature_graph * max_m
    loss_now = elems * _LOSS_TRANSIENT[run.loss] + B * Hq * (R + T) * max_m * 4 * 3
    band = _window_activations(B, T, Hq, run.window, run.sink_tokens, run.chunk_size)
    if run.loss == "output":  # the twin's chunked forward on full T, saved for backward, per layer
        twin = _twin_activations(B, T, Hq, Hk, d, max_m)  # the band saves nothing: captured q/k need no grad
        graphs = L * twin + captured // 2
        one_graph = twin + captured // (2 * max(1, L))
        loss_now = twin + band
    layerwise = Phase("layerwise", tokens=tokens * W * run.accumulate, runs=run.finetune_fraction < 1)
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
    tail_layer = saved + _twin_activations(B, T, Hq, Hk, d, budget) + band
    tail = Phase("tail", tokens=tokens * W * run.accumulate, runs=run.finetune_fraction > 0)
    tail.device.update(static)
    tail.device.update({"teacher logits": logits, "activations (all layers)": a.num_layers * tail_layer,
                        "logits + KL graph": logits + tokens * V * 4 * 6})  # fmt: skip  # packed args
    phases.append(tail)

    # -- validation: student and teacher logits upcast, Perplexity's float32 softmax
    val = Phase("validate", runs=run.validate)
    val.device.update({"teacher shard": shard, "gathered layers": gathered, "twins": twins,
                       "activations (one layer, no grad)": layer_act,
                       "logits (both, float32)": 2 * tokens * V * 4 + logits,
                       "perplexity softmax": 2 * tokens * V * 4})  # fmt: skip  # packed args
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


def _lora_bytes(a: Architecture, rank: int, targets: tuple[str, ...]) -> int:
    """float32 LoRA A (r × in) and B (out × r) of every decoder layer's ``targets`` (Llama's projection names;
    another name counts as hidden × hidden)."""
    h, q, kv, ffn = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.intermediate
    shapes = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, ffn),
        "up_proj": (h, ffn),
        "down_proj": (ffn, h),
    }
    per_layer = sum(sum(shapes.get(t.rsplit(".", 1)[-1], (h, h))) for t in targets)
    return a.num_layers * rank * per_layer * 4


def _window_activations(B: int, T: int, Hq: int, window: int, sinks: int, chunk: int = 64) -> int:
    """Bytes a sliding-window twin's exact part keeps for backward where its q/k/v need gradients (the tail):
    the float32 logits and softmax weights of the band (T queries × C + w − 1 keys per head, chunked) and of
    the sinks; 0 without a window."""
    if window <= 0:
        return 0
    return 2 * 4 * B * Hq * T * (min(chunk, T) + window - 1 + sinks)


def _twin_activations(B: int, T: int, Hq: int, Hk: int, d: int, M: int, chunk: int = 64) -> int:
    """Bytes a twin's chunked linear attention keeps for backward: float32 q/k copies, log-features and
    features of queries and keys (3 each), the intra-chunk score blocks (2 × T·C per head) and the per-chunk
    prefix states (B·Hk·(T/C)·M·d, with the key sums)."""
    qk = T * (Hq + Hk) * d + 3 * T * (Hq + Hk) * M  # q/k copies, their log-features and features
    return 4 * B * (qk + 2 * Hq * T * min(chunk, T) + Hk * -(-T // chunk) * M * (d + 1))
