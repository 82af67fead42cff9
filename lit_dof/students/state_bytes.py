"""What a model's generation cache holds per sequence — a student's decode state, a teacher's KV cache — and the
window whose teacher KV cache holds a student's bytes.

:func:`decode_state_bytes` measures it through the real cache (:func:`closed_form_state_bytes` counts it from the
shapes); :func:`full_state_context` is the context from which a student's linear layers stop growing, and
:func:`state_growth` what the state still grows per token from there (the KV caches of softmax layers);
:func:`equal_state_window` gives the window W' whose teacher KV cache (W' + s tokens) fits in the student's bytes
(the equal-state control, :mod:`lit_dof.evaluation.controls`).
"""

from __future__ import annotations

import torch
from torch import nn

from lit_dof.attention import CausalLinearAttention, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.layers.exact import ExactAttention
from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.students.cache import prefill_cache_nbytes
from lit_dof.students.modeling import LitDofForCausalLM
from lit_dof.students.surgery import exact_heads, linear_layer_mask, linear_modules
from lit_dof.teacher.families import attention_layers, text_config

STATE_LAYOUT = 2
"""What a decode state holds, as a number records of its bytes carry (``lit-dof compare``'s ``ppl.json`` and
``control.json``): 1 kept the window keys' far log-features, 2 (2026-11-28) recomputes them and keeps the rotation
angles of a far term on un-rotated keys. Bumped whenever the layout changes the bytes, so records of another layout
are re-derived, not compared with this one's."""


def _inner(model: nn.Module) -> nn.Module:
    """The transformers model holding the attention modules (a student's wrapped teacher, or ``model``)."""
    return model.model if isinstance(model, LitDofForCausalLM) else model


def _groups(twin: nn.Module) -> list[CausalLinearAttention]:
    return list(twin.groups) if isinstance(twin, HeadGroupedAttention) else [twin]


def full_state_context(model: nn.Module) -> int:
    """The shortest context (tokens) from which the linear layers' decode state stops growing: w + s + 1 for a
    sliding-window student (window and sinks full, a key folded into the linear state), else 1 (a pure linear
    student, or any other causal LM of a supported family)."""
    twins = [g for t in linear_modules(_inner(model)).values() for g in _groups(t)]
    return max([1] + [g.window + g.sink_tokens + 1 for g in twins if isinstance(g, SlidingWindowLinearAttention)])


def counted_context(model: nn.Module, context: int | None) -> int:
    """``context`` checked (tokens ≥ 1), or :func:`full_state_context` for ``None``.

    Raises:
        ValueError: ``context`` is not an integer ≥ 1.
    """
    if context is None:
        return full_state_context(model)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a number of tokens >= 1 (or None for a full window), got {context!r}")
    return context


def _kv_held(config, tokens: int) -> list[int]:
    """Tokens a ``DynamicCache`` keeps per layer at ``tokens`` tokens of context: all of them, or at most
    ``sliding_window − 1`` in a ``sliding_attention`` layer (as :func:`lit_dof.generation.teacher_kv_nbytes`)."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    return [min(tokens, window - 1) if kind == "sliding_attention" and window else tokens for kind in layer_types]


def _rotary_dim(config, head_dim: int) -> int:
    """r, the dims of a head RoPE turns: ``head_dim`` × the ``partial_rotary_factor`` transformers 5 keeps in
    ``rope_parameters`` (1 when absent, e.g. Gemma 3's per-layer-type parameters), even."""
    params = getattr(config, "rope_parameters", None)
    factor = (params.get("partial_rotary_factor") if isinstance(params, dict) else None) or 1.0
    return int(head_dim * factor) // 2 * 2


def _twin_bytes(twin: nn.Module, tokens: int, head_dim: int, kv_size: int, feature_size: int, rotary_dim: int) -> int:
    """One linear layer's decode state per sequence after ``tokens`` tokens (bytes; see the closed form)."""
    total = 0
    for group in _groups(twin):
        if isinstance(group, ExactAttention):  # exact KV heads: their keys and values, a bool flag per token
            total += group.num_kv_heads * tokens * 2 * head_dim * kv_size + tokens
            continue
        heads, features = group.feature_map.num_heads, group.feature_map.feature_dim  # H (Hk, or Hq unshared), M
        linear = heads * features * (head_dim + 2) * 4  # kv (H, M, D) + k_sum, log_scale (H, M): float32
        if not isinstance(group, SlidingWindowLinearAttention):
            total += linear
            continue
        window, sinks = min(group.window, tokens), min(group.sink_tokens, tokens)
        total += heads * (window + sinks) * 2 * head_dim * kv_size + window + sinks  # keys, values; bool flags
        if group.far_term:  # the window keys' rotation angles (r/2 + 1 float32), the linear state once it has a key
            total += window * (rotary_dim // 2 + 1) * 4 if group.needs_rotary else 0
            total += linear if tokens > group.window + group.sink_tokens else 0
        cache = group.sliding_window.far_cache  # K slots (key, value, log-features, score and position: 8 + 8)
        slot_features = features * feature_size if group.far_term else 0
        total += heads * (cache * (2 * head_dim * kv_size + slot_features + 16) + window * 8) if cache else 0
    return total


def closed_form_state_bytes(model: nn.Module, context: int | None = None, *, dtype: torch.dtype | None = None) -> int:
    """The decode state per sequence at ``context`` tokens (bytes), counted from the model's shapes.

    Per attention layer (H: the feature map's heads — Hk with maps shared per KV head, else Hq; M its features;
    d = D the head size; b = min(w, T) window and s' = min(s, T) sink tokens; e the size of ``dtype``):

    * pure linear layer: the linear state (H, M, D) + 2 × (H, M) in float32, H·M·(D + 2)·4;
    * sliding-window layer: the window's and sinks' keys and values H·(b + s')·2d·e, a bool flag per buffered
      token (b + s'), and with a far term the linear state once a key has left the window (T > w + s) and, when
      the far term sees un-rotated keys, each window key's rotation b·(r/2 + 1)·4 (r the rotary dims: the key
      log-features are recomputed when a key leaves the window, not kept); with an exact far cache of K slots,
      H·(K·(2d·e + 4M + 16) + 8b) more (the slots, and each window token's running score; M = 0 without a far
      term);
    * exact KV heads of a per-head layer (feature dim 0), Hk_exact of them: their KV cache Hk_exact·T·2d·e and a
      bool flag per token (T);
    * softmax layer (a hybrid's, a teacher-side sliding layer, every layer of a plain model): the KV cache
      2·Hk·d·held·e, held = T (min(T, sliding_window − 1) in a teacher-side sliding layer).

    So from T ≥ :func:`full_state_context` on, a student without softmax layers holds the same bytes at any
    context; only the keys and values follow its dtype (log-features and linear state are float32).

    Args:
        model: a student, or any causal LM of a supported family (its layers then all count as softmax).
        context: context length T (tokens); ``None``: :func:`full_state_context`.
        dtype: the dtype of the keys and values (default: the model's weights').

    Returns:
        bytes per sequence.

    Raises:
        ValueError: ``context`` < 1. UnsupportedModelError: a model of an unsupported family.
    """
    context = counted_context(model, context)
    inner, dtype = _inner(model), dtype or model.dtype
    kv_size, feature_size = torch.empty((), dtype=dtype).element_size(), 8 if dtype == torch.float64 else 4
    config = text_config(inner)
    held, twins, linear = _kv_held(config, context), linear_modules(inner), linear_layer_mask(inner)
    return sum(
        _twin_bytes(twins[a.index], context, a.head_dim, kv_size, feature_size, _rotary_dim(config, a.head_dim))
        if linear[a.index]
        else 2 * a.num_kv_heads * a.head_dim * held[a.index] * kv_size
        for a in attention_layers(inner)
    )


def decode_state_bytes(model: nn.Module, context: int | None = None, *, measure: bool = True) -> int:
    """What ``model``'s generation cache holds per sequence at ``context`` tokens (bytes, in the model's dtype):
    window/sink keys and values and the linear state per linear layer, the KV cache per softmax layer.

    Measured through the real ``Cache`` after a prefill of min(context, :func:`full_state_context`) tokens (one
    forward on the model's device), plus the growth from there to ``context`` in closed form (only layers that
    keep a KV cache still grow; :func:`closed_form_state_bytes`): a long context costs no long forward.

    Args:
        model: a student, or any causal LM of a supported family (a teacher, a control).
        context: context length T (tokens); ``None``: :func:`full_state_context`, from which a student without
            softmax layers holds the same bytes at any context.
        measure: ``False``: the closed form alone (no forward; e.g. for a model on the meta device).

    Returns:
        bytes per sequence.

    Raises:
        ValueError: ``context`` < 1 (or as :func:`closed_form_state_bytes`).
    """
    context = counted_context(model, context)
    if not measure:
        return closed_form_state_bytes(model, context)
    short = min(context, full_state_context(model))
    growth = closed_form_state_bytes(model, context) - closed_form_state_bytes(model, short)
    return prefill_cache_nbytes(model, short) + growth


def state_growth(model: nn.Module, context: int | None = None) -> int:
    """Bytes the decode state grows per further token once the linear layers' state is full: the KV cache of every
    softmax layer (a teacher's, a hybrid's exact layers), 0 for a student with none (closed form, in the model's
    dtype; :func:`closed_form_state_bytes`). With it, the state at any context T ≥ T0 is
    ``bytes(T0) + growth · (T − T0)`` for T0 ≥ max(``context``, :func:`full_state_context`).

    Args:
        model: a student, or any causal LM of a supported family.
        context: the context (tokens) from which the growth is counted (default :func:`full_state_context`; a
            teacher-side sliding layer stops growing at its window).

    Returns:
        bytes per token.

    Raises:
        ValueError: ``context`` < 1.
    """
    start = max(counted_context(model, context), full_state_context(model))
    return closed_form_state_bytes(model, start + 1) - closed_form_state_bytes(model, start)


def student_window(student: LitDofForCausalLM) -> SlidingWindow:
    """The student's :class:`~lit_dof.attention.SlidingWindow` options (window 0: pure linear).

    Raises:
        TypeError: ``student`` is not a lit-dof student.
    """
    if not isinstance(student, LitDofForCausalLM):
        raise TypeError(f"expected a lit-dof student, got {type(student).__name__}: load one with load_student(DIR)")
    return SlidingWindow.from_dict(student.config.window_options)


def equal_state_window(
    student: LitDofForCausalLM,
    context: int | None = None,
    *,
    dtype: torch.dtype | None = None,
    sink_tokens: int | None = None,
    measure: bool = True,
) -> int:
    """The window W' such that the teacher's KV cache for W' + s tokens takes at most the student's decode-state
    bytes and for W' + 1 + s more (rounded down). With softmax layers in the student, W' + s counts its linear
    layers only (the control keeps those softmax layers' KV cache as the student does).

    E.g. the quickstart student (SmolLM2-135M, window 64 + 4 sinks) holds 4,919,856 bytes: the float32 teacher
    KV cache of 106 tokens (46,080 bytes each), W' = 102 (closed form on its committed feature dims).

    Args:
        student: the student.
        context: context length (tokens) at which the state is counted (``None``: :func:`full_state_context`).
        dtype: the dtype in which the teacher's KV cache is counted. Default ``None``: the student's own, so the
            control, which runs in it (:func:`control_models`), holds no more than the student; ``torch.float32``
            counts a full-precision teacher (issue #40's figure; the same for an fp32 student).
        sink_tokens: s (default: the student's own; 0 for a pure linear student).
        measure: measure the student's state through its cache (``False``: the closed form only).

    Returns:
        W' (tokens).

    Raises:
        TypeError: ``student`` is not a lit-dof student.
        ValueError: the state holds the teacher KV cache of at most s tokens (pass fewer ``sink_tokens``), or
            the student has no linear layers.
    """
    options = student_window(student)
    sinks = options.sink_tokens if sink_tokens is None else sink_tokens
    context = counted_context(student, context)
    state = decode_state_bytes(student, context, measure=measure)
    return window_for_bytes(student, state, context, dtype or student.dtype, sinks)


def window_for_bytes(student: LitDofForCausalLM, state: int, context: int, dtype: torch.dtype, sinks: int) -> int:
    """W' for ``state`` bytes: n tokens of teacher KV in the linear layers' heads, softmax layers and exact KV heads
    as at ``context``."""
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"sink_tokens must be an integer >= 0, got {sinks!r}")
    inner, size = _inner(student), torch.empty((), dtype=dtype).element_size()
    held, linear, whole = _kv_held(text_config(inner), context), linear_layer_mask(inner), exact_heads(inner)
    kv = {layer.index: (layer.num_kv_heads, 2 * layer.head_dim * size) for layer in attention_layers(inner)}
    exact = {i: len(whole.get(i, ())) if linear[i] else n for i, (n, _) in kv.items()}  # KV heads kept whole
    per_token = sum(b * (n - exact[i]) for i, (n, b) in kv.items() if linear[i])
    fixed = sum(b * exact[i] * held[i] for i, (_, b) in kv.items())  # softmax layers' and exact heads' KV caches
    if per_token == 0:
        raise ValueError("the student has no linear layers (every layer runs softmax): it has no equal-state window")
    window = max(0, state - fixed) // per_token - sinks
    if window < 1:
        raise ValueError(
            f"the student's decode state ({state} bytes) holds the {dtype} teacher KV cache of at most {sinks} "
            f"tokens, so no window is left beside {sinks} sink tokens: pass fewer sink_tokens"
        )
    return window
