"""The records of a cell's stages as the comparison report keeps them: the fit's summary (``fit.json``), the
sliding-window perplexity (``ppl.json``), a task's primary metric, a retrieval task's summary, a control's
``control.json``, a fine-tuned score and the fit's attempts; read from JSON by :mod:`lit_dof.records` (pydantic
over these standard dataclasses: validated field by field, building nothing but these types).
:mod:`lit_dof.comparison.records` assembles them into a report.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_dof.evaluation.control_record import Control
from lit_dof.records import dump_record, load_record, parse_record, save_record


@dataclass
class TaskScore:
    """A cell's primary metric on one task: ``value`` ± ``stderr`` over ``n`` examples, and — for a model behind
    an exact window — the share of the task's examples longer than its window + sinks (``beyond_exact``)."""

    value: float | None
    stderr: float | None
    metric: str
    n: int | None
    beyond_exact: float | None = None


@dataclass
class FinetuneScore:
    """What the report reads of a cell's ``finetune/<task>.json`` (METHOD.md §4): the fine-tuned ``score`` (accuracy
    on the report split at the epoch best on the choosing split; MMLU: the last) and ``zero_shot``, the untuned
    model's accuracy on the same documents (``None``: not measured)."""

    score: float
    zero_shot: float | None = None


@dataclass
class StateBytes:
    """A model's decoding state: ``bytes`` per sequence after ``context`` tokens, and the bytes it grows per further
    token (``growth``: the KV caches of its softmax layers; ``None`` in records written before it was recorded), in
    the state layout ``layout`` (:data:`~lit_dof.students.state_bytes.STATE_LAYOUT`; ``None``: the first, 1)."""

    context: int
    bytes: int
    growth: int | None = None
    layout: int | None = None


@dataclass
class ControlRecord:
    """A control's ``control.json`` (:func:`~lit_dof.comparison.control_cells.describe_controls`): what it is
    (``None`` when the student has no such control, with ``why``), where its records are (``records``: a folder
    relative to the control's own; ``None``: its own) and the decode-state layout its bytes were counted in
    (``state_layout``, :data:`~lit_dof.students.state_bytes.STATE_LAYOUT`; ``None``: the first, 1)."""

    control: Control | None
    why: str | None = None
    records: str | None = None
    state_layout: int | None = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> ControlRecord:
        """Read a ``control.json``.

        Raises:
            FileNotFoundError: no such file. ValueError: not JSON, or not a control record (pydantic's error).
        """
        return load_record(cls, path)

    def to_json(self) -> dict:
        """The record as JSON-ready containers."""
        return dump_record(self)


@dataclass
class PerplexityRecord:
    """What the report reads of a cell's ``ppl.json`` (:meth:`~lit_dof.comparison.stages.EvaluationStages.ppl_stage`):
    the sliding-window perplexity over ``tokens`` tokens (``window``, ``stride``; the ``split``, ``None`` for records
    from before the test split: validation), perplexity by position, the decode state and the device."""

    ppl: float
    tokens: int | None = None
    window: int | None = None
    stride: int | None = None
    split: str | None = None
    by_position: dict[str, Any] | None = None
    state: StateBytes | None = None
    device: str | None = None

    @property
    def setting(self) -> str:
        """The measurement's setting, as the report's footnote names it."""
        split = f", {self.split} split" if self.split else ""
        return f"{self.tokens} tokens, window {self.window}, stride {self.stride}{split}"


@dataclass
class DepthCell:
    """Retrieval at one (context, depth): ``n`` items, their ``mean`` exact match and its standard error ``se``."""

    n: int
    mean: float
    se: float


@dataclass
class LongContexts:
    """What the report reads of a cell's ``long.json``: perplexity by position per context (tokens → the
    :mod:`~lit_dof.evaluation.position_report` record) and the device."""

    contexts: dict[str, Any] | None = None
    device: str | None = None


@dataclass
class Provenance:
    """Where and how an evaluation ran: its device (records from before it was kept say only whether CUDA was
    available), a retrieval task's settings and the wall time (seconds)."""

    device: str | None = None
    cuda: bool | None = None
    retrieval: dict[str, Any] | None = None
    seconds: float | None = None

    @property
    def where(self) -> str | None:
        """The device; the CPU for a record that says only that CUDA was unavailable (the comparison ran there)."""
        return self.device or ("cpu" if self.cuda is False else None)


@dataclass
class RetrievalExample:
    """What the report reads of one retrieval item: whether its needle lay beyond the model's exact window (``None``
    for full attention)."""

    beyond_window: bool | None = None


@dataclass
class EvalRecord:
    """An evaluation record as a stage writes it (``eval/<task>.json``, ``retrieval/<task>.json``): lm-eval's metrics
    by name (``metrics``: every number at the record's top level — ``acc``, ``acc_stderr``, ``exact_match``, …), the
    number of examples, the per-example scores by metric, the share of examples beyond the model's exact positions,
    a retrieval task's items and context × depth cells, and the provenance."""

    metrics: dict[str, float] = field(default_factory=dict)
    n: int | None = None
    items: dict[str, list[float]] = field(default_factory=dict)
    beyond_exact: float | None = None
    examples: list[RetrievalExample] = field(default_factory=list)
    cells: dict[int, dict[str, DepthCell]] | None = None
    provenance: Provenance = field(default_factory=Provenance)

    @classmethod
    def load(cls, path: str | os.PathLike) -> EvalRecord:
        """Read a stage's evaluation record.

        Raises:
            FileNotFoundError: no such file. ValueError: not JSON, or a field of the wrong type (pydantic's error).
        """
        data = json.loads(Path(path).read_text())
        numbers = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return parse_record(cls, {**data, "metrics": numbers})


@dataclass
class RetrievalSummary:
    """What the report keeps of a retrieval task (:func:`~lit_dof.comparison.artefacts.retrieval_summary`): exact
    match ± SE over ``n`` items, the context × depth ``cells`` (context in tokens → depth → :class:`DepthCell`), the
    per-example scores in order (``items``), the share of needles beyond the model's window (``None`` for full
    attention) and the provenance (device, settings, seconds)."""

    exact_match: float | None
    exact_match_stderr: float | None
    n: int | None
    cells: dict[int, dict[str, DepthCell]] | None = None
    items: list[float] | None = None
    beyond_window: float | None = None
    provenance: Provenance = field(default_factory=Provenance)

    @property
    def device(self) -> str | None:
        """Where it was measured."""
        return self.provenance.device

    @classmethod
    def from_json(cls, data: dict) -> RetrievalSummary:
        """A summary from its JSON form.

        Raises:
            pydantic.ValidationError: a field of the wrong type.
        """
        return parse_record(cls, data)

    def by_context(self, context: int) -> float | None:
        """The mean exact match over the needle depths at ``context`` tokens (``None``: not measured there)."""
        depths = (self.cells or {}).get(context)
        return sum(d.mean for d in depths.values()) / len(depths) if depths else None


@dataclass
class FitSummary:
    """A cell's ``fit.json`` (:func:`~lit_dof.comparison.artefacts.summarise_fit`): the exported ``student`` (relative
    to the cell), its feature dims (per layer an M, or one M per KV head, 0 for an exact head) and their total Σ M
    (per-head dims count as their layer mean), optimizer steps, tokens seen, wall time (seconds, over ``attempts``),
    the fit's command, the validation curve ``[(step, perplexity)]``, the allocation strategy and the DoF estimate's
    λ, its rule, what it is relative to and J; the device. A hand-made or partial record leaves the rest ``None``."""

    student: str | None = None
    feature_dims: list[int | list[int]] | None = None
    total_features: int | float | None = None
    steps: int | None = None
    tokens: int | None = None
    wall_seconds: float | None = None
    attempts: int | None = None
    command: str | None = None
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    strategy: str | None = None
    lam: float | None = None
    lam_rule: str | None = None
    relative_to: str | None = None
    num_samples: int | None = None
    device: str | None = None

    @property
    def uses_dof(self) -> bool:
        """Whether the dims came from a DoF allocation (its λ and J apply)."""
        return self.strategy in ("dof", "dof_clip")


FIT_FILE = "fit.json"
"""A finished cell's fit summary (:class:`FitSummary`)."""

ATTEMPTS_FILE = "fit_attempts.json"
"""A cell's record of its fit's attempts (:class:`FitAttempt`)."""


@dataclass
class FitAttempt:
    """One run of a cell's fit (``fit_attempts.json`` lists them in order): its wall time (seconds), its exit code
    (``None``: interrupted), whether it resumed from a checkpoint, the DoF report a fresh start wrote (an absolute
    path: the one its checkpoints' feature dims come from) and ``False`` when it stopped before exporting."""

    seconds: float
    returncode: int | None
    resumed: bool = False
    dof_report: str | None = None
    exported: bool | None = None


def load_attempts(path: str | os.PathLike) -> list[FitAttempt]:
    """A cell's ``fit_attempts.json`` (empty when there is none).

    Raises:
        ValueError: not JSON, or not a list of attempts (pydantic names the field).
    """
    return load_record(list[FitAttempt], path) or []


def save_attempts(path: str | os.PathLike, attempts: list[FitAttempt]) -> None:
    """Write ``fit_attempts.json``, atomically."""
    save_record(path, attempts, list[FitAttempt])
