"""The controls every student is shown beside: the teacher at the student's window and at the same memory, and the
student's own weights without a linear part.

The bytes come from :mod:`lit_dof.students.state_bytes` (re-exported here: :func:`decode_state_bytes`,
:func:`closed_form_state_bytes`, :func:`equal_state_window`, :func:`full_state_context`). :func:`control_models`
builds ``window_sinks`` (a), the teacher behind the student's own window + sinks without a far term,
``equal_state`` (b), the teacher behind W' + s — both :func:`~lit_dof.students.linearize` of the teacher with
``SlidingWindow(far_term=False)`` — ``tail_only`` (c), the student's (LoRA-merged) weights with full softmax
attention in a plain model of the teacher's class, and ``far_only`` (d), the student with its window cut to the
token itself and no sinks: its far term alone. Each is an ordinary causal LM (forward, ``generate``,
perplexity, lm-eval) with a :class:`Control` record.

Pure linear students (window 0): (a) would be the teacher attending to nothing, so it is left out; (b) is the
teacher behind W' tokens and the student's 0 sinks, unless ``sink_tokens`` asks for some (StreamingLLM's 4
sinks make a stronger control at the same bytes).

A student with exact KV heads (feature dim 0 in a per-head layer) keeps them exact in (a) and (b) as it keeps its
softmax layers: the controls differ from it only where it is linear.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Literal

import torch
from torch import nn

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.attention.layers.sliding_window import sliding_window_layers
from lit_dof.evaluation.control_record import Control
from lit_dof.students.lora import merged_state_dict
from lit_dof.students.modeling import LitDofForCausalLM, linearize
from lit_dof.students.state_bytes import (
    closed_form_state_bytes,
    counted_context,
    decode_state_bytes,
    equal_state_window,
    full_state_context,
    state_growth,
    student_window,
    window_for_bytes,
)
from lit_dof.students.surgery import exact_heads
from lit_dof.teacher.loading import load_teacher

__all__ = [
    "CONTROL_ATTRIBUTE",
    "Control",
    "closed_form_state_bytes",
    "control_info",
    "control_models",
    "decode_state_bytes",
    "equal_state_window",
    "far_only_model",
    "full_state_context",
    "state_growth",
    "tail_only_model",
    "tuned_parameters",
]

CONTROL_ATTRIBUTE = "lit_dof_control"
"""The attribute under which a control model carries its :class:`Control` record."""

TWIN_KEY = ".lit_dof."
"""Part of the state-dict key of every twin parameter (``...self_attn.lit_dof.linear...``)."""


def control_info(model: nn.Module) -> Control | None:
    """The :class:`Control` record of a model made by :func:`control_models`, or ``None`` for any other model."""
    return getattr(model, CONTROL_ATTRIBUTE, None)


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


def _window_control(
    teacher: nn.Module,
    student: LitDofForCausalLM,
    window: int,
    sinks: int,
    note: str,
    record: dict,
    name: str = "window_sinks",
) -> nn.Module:
    """The teacher behind an exact window + sinks, no far term (the student's softmax layers stay softmax, its
    exact KV heads exact)."""
    control = linearize(
        _shared_copy(teacher),
        LearnedPRF,
        1,
        sliding_window=SlidingWindow(window=window, sink_tokens=sinks, far_term=False),
        softmax_layers=student.config.softmax_layers,
        chunk_size=student.config.chunk_size,
        seed=0,
        exact_heads=exact_heads(student.model),
    )  # LearnedPRF(M=1) is never called without a far term
    text = f"teacher, exact window {window} + {sinks} sinks: {note}"
    return _labelled(
        control.eval(), name=name, description=text, window=window, sink_tokens=sinks, weights="teacher", **record
    )


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


def far_only_model(student: LitDofForCausalLM) -> LitDofForCausalLM:
    """The student with its window cut to the query's own token and no sinks: everything else comes from its far
    term — what the far term carries alone (the check against a student that bypasses its linear part, arXiv
    2510.05901). Softmax layers and exact KV heads are not windows and stay as they are. Its weight tensors are the
    student's (no copy).

    Args:
        student: a sliding-window student with a far term.

    Raises:
        TypeError: ``student`` is not a lit-dof student.
        ValueError: a student without a window or without a far term.
    """
    options = student_window(student)
    if not (options.enabled and options.far_term):
        raise ValueError("far_only needs a sliding-window student with a far term (window >= 1, far_term: true)")
    alone = dataclasses.replace(options, window=1, sink_tokens=0)
    model = _shared_copy(student)
    for layer in sliding_window_layers(model):  # per-head dims: every group
        layer.sliding_window = alone
    model.config.window_options = alone.to_dict()
    return model.eval()


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
        student's weights differ from the teacher's (:func:`tuned_parameters`: a merged LoRA tail) or ``tail``;
        ``far_only`` (d), :func:`far_only_model`, for a sliding-window student with a far term.

    Raises:
        TypeError: ``student`` is not a lit-dof student.
        ValueError: no teacher given or recorded; a teacher of another architecture, dtype or device; no window
            left at the equal state (:func:`equal_state_window`); a ``tail`` other than the three values.
        TeacherNotFoundError: the recorded teacher cannot be loaded (:func:`lit_dof.load_teacher`).
    """
    options = student_window(student)
    if tail not in (True, False, "auto"):
        raise ValueError(f"tail must be 'auto', True or False, got {tail!r}")
    teacher = _resolve_teacher(student, teacher)
    counted = counted_context(student, context)
    state, dtype = decode_state_bytes(student, counted), dtype or student.dtype
    sinks = options.sink_tokens if sink_tokens is None else sink_tokens
    window, kv = window_for_bytes(student, state, counted, dtype, sinks), str(dtype).removeprefix("torch.")
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
    if options.enabled and options.far_term:
        controls["far_only"] = _labelled(
            far_only_model(student),
            name="far_only",
            description="the student with its window cut to the token itself and no sinks: its far term alone",
            window=1,
            sink_tokens=0,
            weights="student",
            **record,
        )
    if tail is True or (tail == "auto" and tuned_parameters(student, teacher)):
        text = "the student's weights (LoRA tail merged), full softmax attention, no linear part"
        controls["tail_only"] = _labelled(
            tail_only_model(student, teacher),
            name="tail_only",
            description=text,
            window=None,
            sink_tokens=0,
            weights="student",
            **record,
        )
    return controls
