"""The controls every student is shown beside: its decode-state bytes and the teacher at the same memory.

:func:`decode_state_bytes` measures what a generation cache holds per sequence (:func:`closed_form_state_bytes`
counts it from the shapes); :func:`equal_state_window` gives the window W' whose teacher KV cache (W' + s tokens)
fits in those bytes; :func:`control_models` builds ``window_sinks`` (a), the teacher behind the student's own
window + sinks without a far term, ``equal_state`` (b), the teacher behind W' + s — both
:func:`~lit_dof.students.linearize` of the teacher with ``SlidingWindow(far_term=False)`` — and ``tail_only``
(c), the student's (LoRA-merged) weights with full softmax attention in a plain model of the teacher's class.
Each is an ordinary causal LM (forward, ``generate``, perplexity, lm-eval) with a :class:`Control` record.

Pure linear students (window 0): (a) would be the teacher attending to nothing, so it is left out; (b) is the
teacher behind W' tokens and the student's 0 sinks, unless ``sink_tokens`` asks for some (StreamingLLM's 4
sinks make a stronger control at the same bytes).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import nn

from lit_dof.attention import CausalLinearAttention, LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.students.cache import prefill_cache_nbytes
from lit_dof.students.lora import merged_state_dict
from lit_dof.students.modeling import LitDofForCausalLM, linearize
from lit_dof.students.surgery import linear_layer_mask, linear_modules
from lit_dof.teacher.families import attention_layers, text_config
from lit_dof.teacher.loading import load_teacher

CONTROL_ATTRIBUTE = "lit_dof_control"
"""The attribute under which a control model carries its :class:`Control` record."""

TWIN_KEY = ".lit_dof."
"""Part of the state-dict key of every twin parameter (``...self_attn.lit_dof.linear...``)."""


@dataclass(frozen=True)
class Control:
    """What a control model is, for a report's label.

    Attributes:
        name: ``window_sinks``, ``equal_state`` or ``tail_only``.
        description: one line saying what it is.
        window: tokens attended exactly besides the sinks (the query's own included); ``None``: full attention.
        sink_tokens: first tokens always attended exactly.
        weights: ``teacher`` (the original weights) or ``student`` (the student's, LoRA tail merged).
        context: the context length (tokens) at which the bytes are counted.
        state_bytes: this control's decode state per sequence at ``context`` (bytes, :func:`decode_state_bytes`).
        student_state_bytes: the student's at the same context (bytes).
    """

    name: str
    description: str
    window: int | None
    sink_tokens: int
    weights: str
    context: int
    state_bytes: int
    student_state_bytes: int

    def to_dict(self) -> dict:
        """The record as a JSON-ready dict."""
        return asdict(self)


def control_info(model: nn.Module) -> Control | None:
    """The :class:`Control` record of a model made by :func:`control_models`, or ``None`` for any other model."""
    return getattr(model, CONTROL_ATTRIBUTE, None)


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


def _check_context(model: nn.Module, context: int | None) -> int:
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


def _twin_bytes(twin: nn.Module, tokens: int, head_dim: int, kv_size: int, feature_size: int) -> int:
    """One linear layer's decode state per sequence after ``tokens`` tokens (bytes; see the closed form)."""
    total = 0
    for group in _groups(twin):
        heads, features = group.feature_map.num_heads, group.feature_map.feature_dim  # H (Hk, or Hq unshared), M
        linear = heads * features * (head_dim + 2) * 4  # kv (H, M, D) + k_sum, log_scale (H, M): float32
        if not isinstance(group, SlidingWindowLinearAttention):
            total += linear
            continue
        window, sinks = min(group.window, tokens), min(group.sink_tokens, tokens)
        total += heads * (window + sinks) * 2 * head_dim * kv_size + window + sinks  # keys, values; bool flags
        if group.far_term:  # the window's key log-features, and the far keys' linear state once there is one
            total += heads * window * features * feature_size
            total += linear if tokens > group.window + group.sink_tokens else 0
    return total


def closed_form_state_bytes(model: nn.Module, context: int | None = None, *, dtype: torch.dtype | None = None) -> int:
    """The decode state per sequence at ``context`` tokens (bytes), counted from the model's shapes.

    Per attention layer (H: the feature map's heads — Hk with maps shared per KV head, else Hq; M its features;
    d = D the head size; b = min(w, T) window and s' = min(s, T) sink tokens; e the size of ``dtype``):

    * pure linear layer: the linear state (H, M, D) + 2 × (H, M) in float32, H·M·(D + 2)·4;
    * sliding-window layer: the window's and sinks' keys and values H·(b + s')·2d·e, a bool flag per buffered
      token (b + s'), and with a far term the window's key log-features H·b·M·4 (8 for float64) plus the linear
      state once a key has left the window (T > w + s);
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
    context = _check_context(model, context)
    inner, dtype = _inner(model), dtype or model.dtype
    kv_size, feature_size = torch.empty((), dtype=dtype).element_size(), 8 if dtype == torch.float64 else 4
    held, twins, linear = _kv_held(text_config(inner), context), linear_modules(inner), linear_layer_mask(inner)
    return sum(
        _twin_bytes(twins[a.index], context, a.head_dim, kv_size, feature_size)
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
    context = _check_context(model, context)
    if not measure:
        return closed_form_state_bytes(model, context)
    short = min(context, full_state_context(model))
    growth = closed_form_state_bytes(model, context) - closed_form_state_bytes(model, short)
    return prefill_cache_nbytes(model, short) + growth


def _student_window(student: LitDofForCausalLM) -> SlidingWindow:
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

    E.g. the quickstart student (SmolLM2-135M, window 64 + 4 sinks) holds 6,150,960 bytes: the float32 teacher
    KV cache of 133 tokens (46,080 bytes each), W' = 129.

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
    options = _student_window(student)
    sinks = options.sink_tokens if sink_tokens is None else sink_tokens
    context = _check_context(student, context)
    state = decode_state_bytes(student, context, measure=measure)
    return _equal_window(student, state, context, dtype or student.dtype, sinks)


def _equal_window(student: LitDofForCausalLM, state: int, context: int, dtype: torch.dtype, sinks: int) -> int:
    """W' for ``state`` bytes: n tokens of teacher KV in the linear layers, softmax layers as at ``context``."""
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
        raise ValueError(f"sink_tokens must be an integer >= 0, got {sinks!r}")
    inner, size = _inner(student), torch.empty((), dtype=dtype).element_size()
    held, linear = _kv_held(text_config(inner), context), linear_layer_mask(inner)
    kv = {layer.index: 2 * layer.num_kv_heads * layer.head_dim * size for layer in attention_layers(inner)}  # /token
    per_token = sum(b for i, b in kv.items() if linear[i])
    fixed = sum(b * held[i] for i, b in kv.items() if not linear[i])
    if per_token == 0:
        raise ValueError("the student has no linear layers (every layer runs softmax): it has no equal-state window")
    window = max(0, state - fixed) // per_token - sinks
    if window < 1:
        raise ValueError(
            f"the student's decode state ({state} bytes) holds the {dtype} teacher KV cache of at most {sinks} "
            f"tokens, so no window is left beside {sinks} sink tokens: pass fewer sink_tokens"
        )
    return window


def tuned_parameters(student: LitDofForCausalLM, teacher: nn.Module) -> list[str]:
    """The student's non-twin weights (LoRA merged) that differ from the teacher's, by name: a tail, or empty.

    Raises:
        ValueError: the teacher's weights do not match the student's architecture (names and shapes).
    """
    own, theirs = _student_weights(student), teacher.state_dict()
    _check_same_architecture(own, theirs)
    return [k for k, v in own.items() if not torch.equal(v, theirs[k].to(device=v.device, dtype=v.dtype))]


def _student_weights(student: LitDofForCausalLM) -> dict[str, torch.Tensor]:
    """The wrapped teacher's state dict with LoRA merged and the twins dropped (what a plain model holds)."""
    return {k: v for k, v in merged_state_dict(student.model).items() if TWIN_KEY not in f".{k}"}


def _check_same_architecture(own: dict, theirs: dict) -> None:
    if any(TWIN_KEY in f".{k}" for k in theirs):
        raise ValueError("the teacher has lit-dof twins attached (a student's wrapped model): pass the original one")
    shapes, expected = ({k: tuple(v.shape) for k, v in d.items()} for d in (own, theirs))
    if shapes != expected:
        diff = sorted(set(shapes).symmetric_difference(expected)) or [k for k in shapes if shapes[k] != expected[k]]
        raise ValueError(
            f"the teacher's weights do not match the student's architecture (first differences: {diff[:3]}): pass "
            "the teacher the student was linearised from"
        )


def _resolve_teacher(student: LitDofForCausalLM, teacher: nn.Module | None) -> nn.Module:
    device = student.get_input_embeddings().weight.device
    if teacher is None:
        if not student.config.teacher:
            raise ValueError("the student records no teacher (config.teacher is empty): pass teacher=the model")
        teacher = load_teacher(student.config.teacher, dtype=student.dtype, device=device)[0]
    if isinstance(teacher, LitDofForCausalLM):
        raise ValueError("teacher is a lit-dof student: pass the original teacher, e.g. lit_dof.load_teacher(...)")
    weight = teacher.get_input_embeddings().weight
    if (weight.dtype, weight.device) != (student.dtype, device):
        raise ValueError(
            f"the teacher is {weight.dtype} on {weight.device}, the student {student.dtype} on {device}: load the "
            "teacher in the student's dtype and device (load_teacher(..., dtype=, device=)), or pass teacher=None"
        )
    return teacher


def _shared_copy(model: nn.Module) -> nn.Module:
    """A new module tree over ``model``'s own parameters and buffers (no copy): surgery on it leaves ``model``."""
    return copy.deepcopy(model, {id(t): t for t in (*model.parameters(), *model.buffers())})


def _window_control(teacher: nn.Module, student: LitDofForCausalLM, window: int, sinks: int, note: str,
                    record: dict, name: str = "window_sinks") -> nn.Module:  # fmt: skip
    """The teacher behind an exact window + sinks, no far term (the student's softmax layers stay softmax)."""
    control = linearize(
        _shared_copy(teacher), LearnedPRF, 1, sliding_window=SlidingWindow(window=window, sink_tokens=sinks,
        far_term=False), softmax_layers=student.config.softmax_layers, chunk_size=student.config.chunk_size, seed=0,
    )  # fmt: skip  # packed args; LearnedPRF(M=1) is never called without a far term
    text = f"teacher, exact window {window} + {sinks} sinks: {note}"
    return _labelled(control.eval(), name=name, description=text, window=window, sink_tokens=sinks, weights="teacher",
                     **record)  # fmt: skip


def tail_only_model(student: LitDofForCausalLM, teacher: nn.Module) -> nn.Module:
    """The student's weights (LoRA adapters merged) in a plain model of the teacher's class: full softmax attention
    everywhere, no linear part — what :meth:`~lit_dof.students.LitDofForCausalLM.teacher_mode` computes for an
    exported student, as a standalone causal LM. Its weight tensors are the student's (no copy).

    Args:
        student: the student.
        teacher: a model of the teacher's architecture (its module tree and buffers are used, not its weights).

    Raises:
        ValueError: the teacher's architecture does not match the student's.
    """
    own = _student_weights(student)
    _check_same_architecture(own, teacher.state_dict())
    plain = _shared_copy(teacher)
    plain.load_state_dict(own, assign=True)  # new Parameters over the student's tensors; the teacher keeps its own
    return plain.eval().requires_grad_(False)


def _labelled(model: nn.Module, **fields) -> nn.Module:
    info = Control(**fields, state_bytes=decode_state_bytes(model, fields["context"]))
    setattr(model, CONTROL_ATTRIBUTE, info)
    return model


def control_models(
    student: LitDofForCausalLM,
    teacher: nn.Module | None = None,
    *,
    context: int | None = None,
    dtype: torch.dtype | None = None,
    sink_tokens: int | None = None,
    tail: bool | Literal["auto"] = "auto",
) -> dict[str, nn.Module]:
    """The controls of a student, each an ordinary causal LM with a :class:`Control` record (:func:`control_info`)
    in the student's dtype on its device. (a) and (b) share the teacher's weight tensors, (c) the student's
    (nothing is copied; do not train them).

    Args:
        student: the student.
        teacher: the teacher it was linearised from, in the student's dtype and on its device (left unchanged);
            ``None``: loaded from ``student.config.teacher`` (:func:`lit_dof.load_teacher`).
        context: context length (tokens) at which bytes are counted (``None``: the shortest at which the student's
            state and (a)'s and (b)'s have stopped growing, max(:func:`full_state_context`, W' + s + 1); (c)'s
            full KV cache grows with any context).
        dtype: the dtype of the teacher KV cache that (b) equals (default: the student's; see
            :func:`equal_state_window`).
        sink_tokens: the sinks of (b) (default: the student's own).
        tail: include (c): ``"auto"`` where the weights differ, ``True`` always, ``False`` never.

    Returns:
        ``{name: model}``: ``window_sinks`` (a), the teacher behind the student's own window + sinks, no far term
        (not for a pure linear student: it would attend to nothing); ``equal_state`` (b), the teacher behind
        W' + s (:func:`equal_state_window` at ``context``); ``tail_only`` (c), :func:`tail_only_model`, where the
        student's weights differ from the teacher's (:func:`tuned_parameters`: a merged LoRA tail) or ``tail``.

    Raises:
        TypeError: ``student`` is not a lit-dof student.
        ValueError: no teacher given or recorded; a teacher of another architecture, dtype or device; no window
            left at the equal state (:func:`equal_state_window`); a ``tail`` other than the three values.
        TeacherNotFoundError: the recorded teacher cannot be loaded (:func:`lit_dof.load_teacher`).
    """
    options = _student_window(student)
    if tail not in (True, False, "auto"):
        raise ValueError(f"tail must be 'auto', True or False, got {tail!r}")
    teacher = _resolve_teacher(student, teacher)
    counted = _check_context(student, context)
    state, dtype = decode_state_bytes(student, counted), dtype or student.dtype
    sinks = options.sink_tokens if sink_tokens is None else sink_tokens
    window, kv = _equal_window(student, state, counted, dtype, sinks), str(dtype).removeprefix("torch.")
    if context is None:  # count every state where it has stopped growing: (b)'s window full too
        counted = max(counted, window + sinks + 1)
        state = decode_state_bytes(student, counted)
    record = {"context": counted, "student_state_bytes": state}
    controls = {}
    if options.enabled:
        note = "no far term (the student's own exact positions)"
        controls["window_sinks"] = _window_control(teacher, student, options.window, options.sink_tokens, note, record)
    note = f"its {kv} KV cache holds at most the student's {state} bytes"
    controls["equal_state"] = _window_control(teacher, student, window, sinks, note, record, name="equal_state")
    if tail is True or (tail == "auto" and tuned_parameters(student, teacher)):
        text = "the student's weights (LoRA tail merged), full softmax attention, no linear part"
        controls["tail_only"] = _labelled(tail_only_model(student, teacher), name="tail_only", description=text,
                                          window=None, sink_tokens=0, weights="student", **record)  # fmt: skip
    return controls
