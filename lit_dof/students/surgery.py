"""Attention surgery: give each teacher attention layer a linear twin, switchable back to softmax.

The teacher's attention modules keep computing their projections, RoPE and GQA layout; lit-dof attaches
an :class:`~lit_dof.interface.AttentionSlot` (submodule ``lit_dof``) holding a
:class:`~lit_dof.attention.CausalLinearAttention` and sets the model's attention implementation to
``"lit_dof"`` (:mod:`lit_dof.interface`), so the linear kernel receives exactly the q/k/v softmax would.
No modeling file is copied or patched.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from lit_dof.attention import (
    CausalLinearAttention,
    FeatureMap,
    FeatureMapFactory,
    SlidingWindow,
    SlidingWindowLinearAttention,
)
from lit_dof.attention.feature_maps.registry import feature_map_name, registered_feature_map
from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE
from lit_dof.interface import ATTN_IMPLEMENTATION, AttentionSlot, install_attention_hook
from lit_dof.teacher.families import AttentionLayer, attention_layers, has_rotary_positions


def feature_map_spec(feature_map: FeatureMap) -> dict:
    """``{"class": "module.QualName", "kwargs": {...}}`` recording how to rebuild ``feature_map``."""
    return {"class": feature_map_name(type(feature_map)), "kwargs": feature_map.config_kwargs()}


def feature_map_class(spec: dict) -> type[FeatureMap]:
    """The registered feature-map class a :func:`feature_map_spec` names; nothing is imported.

    Args:
        spec: ``{"class": "module.QualName", ...}`` from a student's ``config.json``.

    Returns:
        The class (lit-dof's own maps, and any registered with
        :func:`~lit_dof.attention.register_feature_map`).

    Raises:
        ValueError: the name is not registered (the message names ``register_feature_map``).
    """
    return registered_feature_map(str(spec.get("class", "")))


def resolve_feature_dims(feature_dims: int | Sequence[int | Sequence[int]], num_layers: int) -> list[int | list[int]]:
    """Feature dimensions per layer from an int (uniform) or a length-L sequence whose entries are an int
    (M_s for the layer) or a list of ints (M_h per KV head: per-head dims, ``dof_head``; 0 keeps that KV head
    exact, :class:`~lit_dof.attention.layers.exact.ExactAttention`).

    Raises:
        ValueError: wrong length, a layer's dimension that is not a positive integer, or a KV head's that is not
            an integer ≥ 0.
    """
    dims = [feature_dims] * num_layers if isinstance(feature_dims, int) else list(feature_dims)
    if len(dims) != num_layers:
        raise ValueError(f"feature_dims has {len(dims)} entries but the model has {num_layers} attention layers")
    out = []
    for i, m in enumerate(dims):
        per_head = isinstance(m, (list, tuple))
        values, least = (list(m), 0) if per_head else ([m], 1)
        if not values or any(isinstance(x, bool) or not isinstance(x, int) or x < least for x in values):
            raise ValueError(
                f"feature dim of layer {i} must be a positive integer (or one integer >= 0 per KV head, 0: exact), "
                f"got {m!r}; use a DoF allocation (lit_dof.dof.allocate_feature_dims) or the head size"
            )
        out.append(values if per_head else m)
    return out


def with_exact_heads(
    feature_dims: Sequence[int | Sequence[int]], exact_heads: Mapping[int, Sequence[int]], num_kv_heads: Sequence[int]
) -> list[int | list[int]]:
    """``feature_dims`` with the listed KV heads exact (M = 0): a layer with exact heads gets one M per KV head,
    its other heads keeping the layer's M (or their own, for per-head dims). DuoAttention's split of retrieval
    and streaming heads (arXiv 2410.10819, §3) in lit-dof's per-head dims.

    Args:
        feature_dims: per layer, M or one M per KV head (as :func:`resolve_feature_dims` returns them).
        exact_heads: ``{layer index: [KV head, …]}``.
        num_kv_heads: Hk of every layer.

    Returns:
        the new per-layer dims (``feature_dims`` itself is not changed).

    Raises:
        ValueError: a layer index outside 0..L−1 or a KV head outside 0..Hk−1, or dims of another length.
    """
    if len(feature_dims) != len(num_kv_heads):
        raise ValueError(f"feature_dims has {len(feature_dims)} entries for {len(num_kv_heads)} layers")
    out = [list(m) if isinstance(m, (list, tuple)) else m for m in feature_dims]
    fix = (
        "; exact heads are a teacher's own (configs/quickstart.yaml's are SmolLM2-135M's): for another teacher "
        "pass --model.init_args.exact_heads={}, that teacher's heads, or the probe that finds them: "
        "--model.init_args.exact_heads=lit_dof.pipeline.exact_heads.RetrievalHeads"
    )
    for index, heads in exact_heads.items():
        try:
            _check_indices([index], len(out))
        except ValueError:
            layers = f"0..{len(out) - 1}"
            raise ValueError(f"exact_heads names layer {index!r}, outside the teacher's {layers}{fix}") from None
        kv = num_kv_heads[index]
        if any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < kv for h in heads):
            raise ValueError(f"exact_heads of layer {index} must be KV heads in 0..{kv - 1}, got {list(heads)!r}{fix}")
        m = out[index]
        per_head = m if isinstance(m, list) else [m] * kv
        out[index] = [0 if h in heads else x for h, x in enumerate(per_head)]
    return out


def layer_mean_dims(feature_dims: Sequence[int | Sequence[int]]) -> list[float | int]:
    """M per layer as the budget C counts it: the layer's M, or the mean over its KV heads for a layer with
    per-head dims (so a ``dof_head`` allocation and a per-layer one of the same budget have the same sum)."""
    return [m if isinstance(m, int) else sum(m) / len(m) for m in feature_dims]


def twin_layer_dims(
    feature_dims: Sequence[int | Sequence[int]], layer_types: Sequence[str] | None = None
) -> list[int | Sequence[int]]:
    """The dims of the layers that have a twin: a teacher's own sliding-window layers (``layer_types`` entry
    ``"sliding_attention"``: Gemma 3's five of six, Qwen2's with ``use_sliding_window``) stay softmax and have
    none, their entries in ``feature_dims`` are placeholders. A hybrid's softmax layers keep theirs (their twins
    exist, switched off).

    Args:
        feature_dims: per layer, M or one M per KV head.
        layer_types: the text config's ``layer_types`` (``None`` or shorter: the other layers have twins).

    Returns:
        ``feature_dims`` without the teacher's sliding-window layers.
    """
    sliding = teacher_sliding_layers(layer_types)
    return [m for i, m in enumerate(feature_dims) if i not in sliding]


def teacher_sliding_layers(layer_types: Sequence[str] | None) -> set[int]:
    """The indices of a teacher's own sliding-window layers (``layer_types`` entry ``"sliding_attention"``), which
    keep softmax attention and get no twin; empty for ``None``."""
    return {i for i, kind in enumerate(layer_types or ()) if kind == "sliding_attention"}


def attach_linear_attention(
    model: nn.Module,
    feature_map_factory: FeatureMapFactory,
    feature_dims: int | Sequence[int],
    *,
    softmax_layers: Iterable[int] = (),
    share_kv_maps: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    sliding_window: SlidingWindow = SlidingWindow(),
    seed: int | None = None,
) -> list[AttentionLayer]:
    """Attach a linear twin to every linearisable attention layer of ``model`` (in place).

    Args:
        model: a supported transformers causal LM (:mod:`lit_dof.teacher.families`).
        feature_map_factory: ``(head_dim, num_heads, feature_dim) -> FeatureMap``; any feature-map class.
        feature_dims: M per layer (length L; entries of sliding-window layers are ignored) or one int; an entry
            may be a list of M per KV head (per-head dims: the layer becomes a
            :class:`~lit_dof.attention.layers.grouped.HeadGroupedAttention`, needs ``share_kv_maps``).
        softmax_layers: layer indices that keep softmax attention (switchable later).
        share_kv_maps: one φ per KV head (default; state ÷ GQA group) or one per query head.
        chunk_size: chunk size of the parallel form.
        sliding_window: ``SlidingWindow()`` (window 0, the default) for pure linear attention; a window w ≥ 1
            makes every twin a :class:`~lit_dof.attention.SlidingWindowLinearAttention` (the last w tokens exact,
            plus sinks, far term, mixing weight and decay as the value says).
        seed: when given, each layer's feature map draws its initial values from the CPU generator seeded with
            :func:`layer_seed` ``(seed, layer index)``, so processes that consumed different random numbers
            before still build identical twins; ``None``: the global RNG as it stands.

    Returns:
        the model's :class:`~lit_dof.teacher.families.AttentionLayer` list.

    Raises:
        UnsupportedModelError: unsupported family. ValueError: bad feature dims or layer indices, or
            ``sliding_window.far_rope=False`` for a model without rotary positions. TypeError: ``sliding_window``
            is not a :class:`~lit_dof.attention.SlidingWindow`.
    """
    if not isinstance(sliding_window, SlidingWindow):
        raise TypeError(f"sliding_window must be a lit_dof.attention.SlidingWindow, got {sliding_window!r}")
    layers = attention_layers(model)
    if not sliding_window.far_rope and not has_rotary_positions(model):
        raise ValueError(
            f"sliding_window.far_rope=False undoes rotary positions, but {type(model).__name__} has none (absolute "
            "position embeddings): use far_rope=True"
        )
    dims = resolve_feature_dims(feature_dims, len(layers))
    softmax = _check_indices(softmax_layers, len(layers))
    for layer in layers:
        module = layer.module
        if not layer.linearizable:
            continue
        reference = next(module.parameters())
        # Built on the CPU (feature-map inits draw random/QMC numbers there), then moved next to the teacher;
        # under from_pretrained that is the meta device and the checkpoint fills the values in.
        windowed = {"sliding_window": sliding_window} if sliding_window.enabled else {}
        cls = SlidingWindowLinearAttention if sliding_window.enabled else CausalLinearAttention

        def build(num_heads: int, num_kv_heads: int, feature_dim: int, head_dim: int = layer.head_dim):
            return cls.from_factory(
                feature_map_factory,
                head_dim,
                feature_dim,
                num_heads,
                num_kv_heads,
                share_kv_maps=share_kv_maps,
                chunk_size=chunk_size,
                **windowed,
            )

        m = dims[layer.index]
        if isinstance(m, list) and (not share_kv_maps or len(m) != layer.num_kv_heads):
            raise ValueError(
                f"layer {layer.index}: per-head feature dims need one M per KV head "
                f"({layer.num_kv_heads}) and share_kv_maps=True, "
                f"got {m} (share_kv_maps={share_kv_maps})"
            )
        with torch.device("cpu"), _seeded(None if seed is None else layer_seed(seed, layer.index)):
            if isinstance(m, list):
                linear = HeadGroupedAttention(build, m, layer.num_heads)
            else:
                linear = build(layer.num_heads, layer.num_kv_heads, m)
        linear.to(device=reference.device)
        module.lit_dof = AttentionSlot(linear, use_softmax=layer.index in softmax)
        install_attention_hook(module)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return layers


def layer_seed(seed: int, index: int) -> int:
    """The seed of layer ``index``'s twin, derived from a run ``seed`` (≥ 0) by numpy's ``SeedSequence``."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Within the block the global CPU generator is seeded with ``seed`` (no-op for ``None``); its state is
    restored afterwards, so the caller's random stream is not disturbed."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


def set_softmax_layers(model: nn.Module, softmax_layers: Iterable[int]) -> list[int]:
    """Switch layers between softmax (listed) and linear (all other linearised layers), without reloading.

    Returns:
        the sorted softmax layer indices.

    Raises:
        ValueError: an index outside 0..L-1.
    """
    layers = attention_layers(model)
    softmax = _check_indices(softmax_layers, len(layers))
    for layer in layers:
        slot = getattr(layer.module, "lit_dof", None)
        if isinstance(slot, AttentionSlot):
            slot.use_softmax = layer.index in softmax
    return sorted(softmax)


def linear_layer_mask(model: nn.Module) -> list[bool]:
    """One bool per attention layer: True where the layer currently runs linear attention."""
    return [
        isinstance(s := getattr(layer.module, "lit_dof", None), AttentionSlot) and s.is_linear
        for layer in attention_layers(model)
    ]


def linear_modules(model: nn.Module) -> dict[int, CausalLinearAttention | HeadGroupedAttention]:
    """``{layer index: its linear twin}`` for every layer that has one (softmax-switched ones included); a
    layer with per-head dims has a :class:`~lit_dof.attention.layers.grouped.HeadGroupedAttention`."""
    out = {}
    for layer in attention_layers(model):
        slot = getattr(layer.module, "lit_dof", None)
        if isinstance(slot, AttentionSlot) and slot.linear is not None:
            out[layer.index] = slot.linear
    return out


def exact_heads(model: nn.Module) -> dict[int, list[int]]:
    """``{layer index: the KV heads its twin keeps exact}`` for every layer with exact heads (feature dim 0 in a
    per-head layer; :func:`with_exact_heads`)."""
    twins = linear_modules(model)
    return {i: t.exact_heads for i, t in twins.items() if isinstance(t, HeadGroupedAttention) and t.exact_heads}


def _check_indices(indices: Iterable[int], num_layers: int) -> set[int]:
    out = set()
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
            raise ValueError(f"layer index {i!r} is outside 0..{num_layers - 1}")
        out.add(i)
    return out
