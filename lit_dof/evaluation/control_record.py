"""What a control model is (:class:`Control`), the record its report cell keeps: apart from
:mod:`lit_dof.evaluation.controls`, which builds the models, so that reading a report needs no model code."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
