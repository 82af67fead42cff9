"""The record of a hybrid search, ``<out>/search.json``, as types: :class:`SearchRecord` and its parts. The search
(:mod:`lit_dof.hybrid.run`) fills it in, :class:`~lit_dof.hybrid.state.SearchState` writes it, the report
(:mod:`lit_dof.hybrid.report`) reads it. :meth:`SearchRecord.from_json` reads every format a search has written
(older ones are upgraded on load); parsing and dumping are pydantic's (:mod:`lit_dof.records`, over these standard
dataclasses), so a record read from disk is validated field by field and builds nothing but these types.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from lit_dof.hybrid.search import Round, Tolerance
from lit_dof.io import atomic_write_json
from lit_dof.records import dump_record, parse_record
from lit_dof.teacher import DEFAULT_TEACHER, EMBEDDED_HUB_SOURCES


def hybrid_key(linear: Iterable[int]) -> str:
    """The key of a hybrid in ``search.json``: its sorted linear layers, comma-separated (``"teacher"``: none)."""
    return ",".join(str(i) for i in sorted(linear)) or "teacher"


@dataclass
class RecordedSettings:
    """What the numbers of a search depend on (:attr:`~lit_dof.hybrid.settings.SearchSettings.settings`); a resumed
    search must repeat them. The fields are :class:`~lit_dof.hybrid.settings.SearchSettings`' of the same names
    (``task`` is ``None`` for the corpus metrics, ``corpus`` for the task metrics; ``dtype`` is ``None`` for
    ``auto``)."""

    bank: str
    task: str | None
    metric: str
    corpus: str | None
    search_items: int
    heldout_items: int
    tolerance: float
    relative: bool
    shortlist: str | None
    shortlist_k: int
    max_linear: int | None
    prefix_cache: bool
    seed: int
    dtype: str | None = None

    @property
    def rule(self) -> Tolerance:
        """The search's acceptance rule (:meth:`~lit_dof.hybrid.search.Tolerance.for_metric`)."""
        return Tolerance.for_metric(self.metric, self.tolerance, self.relative)

    def differences(self, other: RecordedSettings) -> list[str]:
        """The names of the settings whose values differ from ``other``'s, in field order."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


@dataclass
class Measured:
    """One hybrid scored once: its ``score`` (the metric) and the ``seconds`` the scoring took."""

    score: float
    seconds: float


@dataclass
class RecordedRound(Round):
    """A finished round of the greedy search (:class:`~lit_dof.hybrid.search.Round`) and its wall time in
    ``seconds``."""

    seconds: float = 0.0


@dataclass
class Timing:
    """Wall time of the stages that score, in seconds (0 until the stage runs)."""

    local_loss: float = 0.0
    search: float = 0.0
    confirm: float = 0.0
    verify: float = 0.0


@dataclass
class SearchSummary:
    """The greedy search's outcome (:class:`~lit_dof.hybrid.search.SearchResult` without its rounds): the teacher's
    score and the threshold on the search items, the best-scoring and the most linear hybrid with their scores,
    the evaluations of every run of the search together and their ``seconds``."""

    teacher_score: float
    threshold: float
    best: list[int]
    best_score: float | None
    most_linear: list[int]
    most_linear_score: float | None
    evaluations: int
    seconds: float


@dataclass
class Scored:
    """Hybrids scored on one fixed set of ``items`` (the verification): ``scores`` by :func:`hybrid_key`, and the
    tolerance ``threshold`` derived from the teacher's score there."""

    items: int
    scores: dict[str, Measured] = field(default_factory=dict)
    threshold: float | None = None


@dataclass
class Confirmation(Scored):
    """The search's trajectory re-scored on validation items it did not use: :class:`Scored`, and the most linear
    hybrid that passes there (``None`` until the confirmation has run)."""

    most_linear: list[int] | None = None


@dataclass
class Exported:
    """A hybrid saved as a student: its folder ``path`` and its ``linear`` layers."""

    path: str
    linear: list[int]


@dataclass
class Exports:
    """The two exported hybrids: the best-scoring and the most linear one."""

    best: Exported
    most_linear: Exported

    def items(self) -> Iterator[tuple[str, Exported]]:
        """``(name, hybrid)`` pairs, best first: ``name`` is the folder under the search's ``out``."""
        return iter((("best", self.best), ("most_linear", self.most_linear)))


@dataclass
class SearchRecord:
    """Everything a hybrid search measured, in the order the stages measure it (``None``: not measured yet).

    Attributes:
        settings: what the numbers depend on. rounds: the greedy search's rounds. heldout: held-out scores by
            :func:`hybrid_key`. timing: stage wall times.
        items: where the items come from (a sentence). bank_recipe: how the bank was trained (``None``: unknown).
        teacher: the teacher the bank was made from (its name or path, as the student's config records it).
        local_loss, layer_dof: per candidate layer. dof_source: where the DoF came from.
        teacher_search_score: the teacher on the search items. search_evaluations: scorer calls of the search.
        search: the search's outcome. confirm: the confirmation (``None`` when off). exported: the saved hybrids.
        orders: per ordering, its layers in replacement order. counts: numbers of linear layers compared.
        curves: per ordering, held-out score by number of linear layers. heldout_threshold, teacher_heldout: the
        held-out tolerance threshold and teacher score. verify: the verification (``None`` when off).
        num_layers, versions, device, dtype, command: the model size, library versions, where and in which
        dtype it ran, and the command line.
    """

    settings: RecordedSettings
    rounds: list[RecordedRound] = field(default_factory=list)
    heldout: dict[str, Measured] = field(default_factory=dict)
    timing: Timing = field(default_factory=Timing)
    items: str | None = None
    bank_recipe: str | None = None
    teacher: str | None = None
    local_loss: dict[int, float] | None = None
    layer_dof: dict[int, float] | None = None
    dof_source: str | None = None
    teacher_search_score: float | None = None
    search_evaluations: int = 0
    search: SearchSummary | None = None
    confirm: Confirmation | None = None
    exported: Exports | None = None
    orders: dict[str, list[int]] = field(default_factory=dict)
    counts: list[int] = field(default_factory=list)
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    heldout_threshold: float | None = None
    teacher_heldout: float | None = None
    verify: Scored | None = None
    num_layers: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    command: str | None = None

    @property
    def teacher_title(self) -> str:
        """The teacher as the report's title names it: an embedded alias by the model it was made from."""
        if self.teacher in EMBEDDED_HUB_SOURCES:
            return f"the embedded {EMBEDDED_HUB_SOURCES[self.teacher][0].split('/')[-1]}"
        return f"`{self.teacher}`"

    @classmethod
    def from_json(cls, data: dict) -> SearchRecord:
        """A record from its JSON form, older formats upgraded: a record without ``teacher`` was written when every
        search ran on the embedded teacher; ``exported``, ``local_loss`` and ``layer_dof`` before they were measured
        may be absent.

        Raises:
            pydantic.ValidationError: a field of the wrong type, or a required one missing (named in the message).
        """
        if "teacher" not in data:
            data = {**data, "teacher": DEFAULT_TEACHER}
        return parse_record(cls, data)

    def to_json(self) -> dict:
        """The record as JSON-ready containers (integer keys as strings), in field order."""
        return dump_record(self)

    @classmethod
    def load(cls, path: str | os.PathLike) -> SearchRecord:
        """Read ``path`` (:meth:`from_json`).

        Raises:
            FileNotFoundError: no such file. pydantic.ValidationError: not a search record.
        """
        return cls.from_json(json.loads(Path(path).read_text()))

    def save(self, path: str | os.PathLike) -> None:
        """Write the record to ``path`` as JSON, atomically."""
        atomic_write_json(path, self.to_json())
