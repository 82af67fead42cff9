"""Algorithm 1 on a whole model: capture → per-head DoF → layer DoF → allocation, as a JSON report.

Paper Algorithm 1 / METHOD.md §2: run batches through the frozen teacher, pool J post-RoPE query/key
vectors per head (:class:`~lit_dof.teacher.capture.QKReservoir`), compute N_λ per head, take the max over
a layer's heads, and allocate M_s under the uniform budget for every strategy (``dof``, ``dof_clip``,
``fix``). Sliding-window layers (which stay softmax) get no DoF and are left out of the budget.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Iterable, Literal, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lit_dof.attention.ops.rotary import unrotate
from lit_dof.dof.estimator import (
    STRATEGIES,
    DegenerateAllocationWarning,
    RelativeTo,
    allocate_feature_dims,
    allocate_head_feature_dims,
    layer_dof,
    select_lambda,
)
from lit_dof.dof.sharded import sharded_head_dof
from lit_dof.io import atomic_write_json, library_versions
from lit_dof.teacher.capture import Pooling, QKReservoir, _as_inputs, capture_attention, pooled_vectors
from lit_dof.teacher.families import attention_layers


@dataclass
class DoFReport:
    """Per-head and per-layer DoF of a model and the resulting feature dimensions (JSON-serialisable).

    Attributes:
        model: name or path of the model. model_type: its transformers ``model_type``.
        head_size: C (= d). pooling: ``"kv_head"`` or ``"query_head"``.
        lam: the absolute ridge λ used (chosen automatically if ``lam_rule == "auto"``), or the multiplier
            of the Gram scale if ``relative_to`` is set. lam_rule: ``"absolute"``, ``"relative"`` or ``"auto"``.
        relative_to: ``None``, ``"trace"`` or ``"max_eigenvalue"``.
        num_samples: J per head. tokens: valid tokens captured.
        head_dof: per layer, per head N_λ (``None`` for sliding-window layers).
        layer_dof: per-layer max over heads (``None`` for sliding-window layers).
        linearizable: per layer, False for sliding-window layers (kept softmax).
        allocations: strategy → M_s per layer (sliding layers get C, unused); ``dof_head``: per layer, one M
            per KV head (:func:`~lit_dof.dof.allocate_head_feature_dims`).
        warnings: degenerate-allocation warnings raised while allocating.
        seconds: wall time of capture and of the DoF computation (seconds).
        versions: torch / transformers / lit-dof versions.
    """

    model: str
    model_type: str
    head_size: int
    pooling: str
    lam: float
    lam_rule: str
    relative_to: str | None
    num_samples: int
    tokens: int
    head_dof: list[list[float] | None]
    layer_dof: list[float | None]
    linearizable: list[bool]
    allocations: dict[str, list]
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def feature_dims(self, strategy: str = "dof") -> list[int]:
        """M_s per layer for ``strategy`` (``dof``, ``dof_clip`` or ``fix``).

        Raises:
            KeyError: unknown strategy.
        """
        if strategy not in self.allocations:
            raise KeyError(f"unknown strategy {strategy!r}; the report has {sorted(self.allocations)}")
        return list(self.allocations[strategy])

    def to_dict(self) -> dict:
        """The report as plain JSON-serialisable containers (``dataclasses.asdict``), as :meth:`save` writes it."""
        return asdict(self)

    def save(self, path: str | os.PathLike) -> None:
        """Write the report as JSON, atomically."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DoFReport":
        """Read a report written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
        """
        with open(path, encoding="utf-8") as handle:
            return cls(**json.load(handle))


@torch.no_grad()
def collect_samples(
    model: nn.Module,
    batches: Iterable[dict | Tensor],
    num_samples: int,
    *,
    pooling: Pooling = "query_head",
    seed: int = 0,
    progress: bool = True,
    keys: Sequence[int] | None = None,
    far_window: int = 0,
    sink_tokens: int = 0,
    unrotated: bool = False,
) -> tuple[QKReservoir, int]:
    """Stream ``batches`` through the frozen model, keeping J pooled q/k vectors per head and layer.

    ``keys``: one identity per batch (e.g. its global index across ranks); the sample then depends only on
    which batches were seen, not on the process or order (:meth:`~lit_dof.teacher.capture.QKReservoir.add`),
    so per-rank reservoirs merge exactly. ``far_window``, ``sink_tokens``: pool only the vectors of query–key
    pairs at least that far apart (:func:`~lit_dof.teacher.capture.pooled_vectors`). ``unrotated``: pool q/k with
    the rotary embedding undone (:func:`~lit_dof.attention.ops.rotary.unrotate`): the kernel a far term with
    ``far_rope=False`` approximates.

    Returns:
        ``(reservoir, valid tokens seen)``.

    Raises:
        ValueError: ``unrotated`` for a model without rotary positions.
    """
    reservoir = QKReservoir(num_samples, seed=seed)
    tokens = 0
    current: list[int | None] = [None]

    def record(index: int, c) -> None:
        q, k = c.q, c.k
        if unrotated:
            if c.rotary is None:
                raise ValueError(f"unrotated q/k samples need rotary positions; {type(model).__name__} has none")
            q, k = unrotate(q, c.rotary), unrotate(k, c.rotary)
        pooled = pooled_vectors(q, k, c.key_padding, pooling, far_window=far_window, sink_tokens=sink_tokens)
        reservoir.add(index, pooled, key=current[0])

    key_iter = iter(keys) if keys is not None else None
    with capture_attention(model, record):
        for batch in tqdm(batches, desc="capture q/k", unit="batch", disable=not progress):
            current[0] = next(key_iter) if key_iter is not None else None
            inputs = _as_inputs(batch)
            mask = inputs.get("attention_mask")
            tokens += int(mask.sum()) if mask is not None else inputs["input_ids"].numel()
            model(**inputs, use_cache=False)
    return reservoir, tokens


def estimate_model_dof(
    model: nn.Module,
    batches: Iterable[dict | Tensor],
    lam: float | Literal["auto"],
    num_samples: int = 1024,
    *,
    pooling: Pooling = "query_head",
    seed: int = 0,
    progress: bool = True,
    **report_options,
) -> DoFReport:
    """Paper Algorithm 1 end to end on a teacher (METHOD.md §2): :func:`collect_samples` + :func:`dof_report`.

    Args:
        model: a teacher (or student: its q/k are the teacher's) of a supported family.
        batches: ``input_ids (B, T)`` tensors or dicts with ``input_ids`` / ``attention_mask`` (padding is
            excluded from the pools).
        lam: ridge λ > 0 (absolute, or a multiplier with ``relative_to``), or ``"auto"``: the absolute λ at
            which the mean layer DoF is ``target_fraction``·J (:func:`~lit_dof.dof.select_lambda`).
        num_samples: J vectors pooled per head.
        pooling: see :func:`~lit_dof.teacher.capture.pooled_vectors`.
        seed: sampling seed (and the ``"auto"`` λ search's).
        progress: show progress bars.
        **report_options: :func:`dof_report`'s ``relative_to``, ``target_fraction`` (the mean layer DoF as a
            fraction of J that ``lam="auto"`` selects), ``multiple_of`` and ``name``.

    Returns:
        :class:`DoFReport` with allocations for ``dof``, ``dof_clip`` and ``fix``.

    Raises:
        ValueError: too few tokens for J samples, bad λ, or an unsupported model.
        TypeError: an unknown keyword in ``report_options``.

    Warns:
        DegenerateAllocationWarning: saturated DoF or a uniform allocation (also listed in the report).
    """
    start = time.perf_counter()
    reservoir, tokens = collect_samples(model, batches, num_samples, pooling=pooling, seed=seed, progress=progress)
    report = dof_report(model, reservoir, tokens, lam, pooling=pooling, seed=seed, progress=progress, **report_options)
    report.seconds["capture"] = time.perf_counter() - start - report.seconds["dof"]
    return report


def dof_report(
    model: nn.Module,
    reservoir: QKReservoir,
    tokens: int,
    lam: float | Literal["auto"],
    *,
    relative_to: RelativeTo | None = None,
    pooling: Pooling = "query_head",
    target_fraction: float = 0.25,
    multiple_of: int = 1,
    seed: int = 0,
    name: str | None = None,
    progress: bool = True,
    split_across_ranks: bool = False,
    device: torch.device | str | None = None,
) -> DoFReport:
    """DoF and allocations from already collected samples (several λ rules on one capture).

    Arguments as in :func:`estimate_model_dof`; ``reservoir`` and ``tokens`` come from :func:`collect_samples`.
    With ``split_across_ranks`` every rank of the initialised default process group must call this with the same
    samples: each computes the per-head DoF of 1 / world of the layers (on ``device``) and all end with the same
    report (:func:`~lit_dof.dof.sharded.sharded_head_dof`).
    """
    start = time.perf_counter()
    layers = attention_layers(model)
    num_samples = reservoir.num_samples
    lin = [layer.linearizable for layer in layers]
    x = torch.stack([reservoir.samples(layer.index) for layer in layers if layer.linearizable])  # (L', H, J, d)
    if lam == "auto":
        if relative_to is not None:
            raise ValueError("lam='auto' selects an absolute ridge; do not combine it with relative_to")
        lam_value, rule = select_lambda(x, target_fraction, generator=torch.Generator().manual_seed(seed)), "auto"
    else:
        lam_value, rule = float(lam), ("relative" if relative_to else "absolute")
    heads = sharded_head_dof(
        x, lam_value, relative_to=relative_to, device=device, split=split_across_ranks, progress=progress
    )  # (L', H)
    layer_max = layer_dof(heads)
    head_size = layers[0].head_dim
    allocations, caught = {}, []
    for strategy in STRATEGIES:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always", DegenerateAllocationWarning)
            dims = allocate_feature_dims(
                layer_max, head_size, strategy, multiple_of=multiple_of, num_samples=num_samples
            )
        caught += [f"{strategy}: {w.message}" for w in record if issubclass(w.category, DegenerateAllocationWarning)]
        it = iter(dims)
        allocations[strategy] = [next(it) if ok else head_size for ok in lin]
    kv_layers = [layer for layer in layers if layer.linearizable]
    group = kv_layers[0].num_heads // kv_layers[0].num_kv_heads if pooling == "query_head" else 1
    with warnings.catch_warnings():  # the per-layer allocation above has already reported the DoF's state
        warnings.simplefilter("ignore", DegenerateAllocationWarning)
        it = iter(
            allocate_head_feature_dims(
                heads.tolist(), head_size, heads_per_map=group, multiple_of=multiple_of, num_samples=num_samples
            )
        )
    allocations["dof_head"] = [next(it) if ok else head_size for ok in lin]
    for message in caught:
        warnings.warn(message, DegenerateAllocationWarning, stacklevel=3)
    it_heads, it_layers = iter(heads.tolist()), iter(layer_max.tolist())
    config = model.config.get_text_config(decoder=True)
    return DoFReport(
        model=name or getattr(model.config, "name_or_path", "") or type(model).__name__,
        model_type=config.model_type,
        head_size=head_size,
        pooling=pooling,
        lam=lam_value,
        lam_rule=rule,
        relative_to=relative_to,
        num_samples=num_samples,
        tokens=tokens,
        head_dof=[next(it_heads) if ok else None for ok in lin],
        layer_dof=[next(it_layers) if ok else None for ok in lin],
        linearizable=lin,
        allocations=allocations,
        warnings=caught,
        seconds={"dof": time.perf_counter() - start},
        versions=library_versions(),
    )
