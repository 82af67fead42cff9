"""The record of a hybrid search on disk, ``<out>/search.json``: :class:`SearchState` opens it (or starts one),
writes it atomically as soon as a number exists (so a killed search resumes where it stopped) and scores each
hybrid at most once. The record's types are :mod:`lit_dof.hybrid.record`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from lit_dof.hybrid.record import (
    Confirmation,
    Measured,
    RecordedRound,
    RecordedSettings,
    Scored,
    SearchRecord,
    hybrid_key,
)
from lit_dof.hybrid.search import Round

SEARCH_FILE = "search.json"
"""The record's file name inside a search's ``out`` directory."""

__all__ = ["SEARCH_FILE", "SearchState", "hybrid_key"]


class SearchState:
    """``search.json``: settings, then every measured number, written atomically on each change.

    Args:
        path: the record's file; read when it exists, else started empty.
        settings: what the numbers depend on; an existing record must have been written with the same.

    Attributes:
        record: the :class:`~lit_dof.hybrid.record.SearchRecord` (the search adds to it in place).

    Raises:
        ValueError: ``path`` was written with other settings (names the ones that differ).
        pydantic.ValidationError: ``path`` is not a search record.
    """

    def __init__(self, path: Path, settings: RecordedSettings) -> None:
        self.path = path
        if path.is_file():
            self.record = SearchRecord.load(path)
            changed = self.record.settings.differences(settings)
            if changed:
                raise ValueError(
                    f"{path} was written with other settings ({', '.join(changed)}): pass a new --out or delete it"
                )
        else:
            self.record = SearchRecord(settings=settings)

    def save(self) -> None:
        """Write the record (atomically)."""
        self.record.save(self.path)

    def add_round(self, round_: Round, seconds: float) -> None:
        """Append a finished round of the greedy search with its wall time, count its evaluations, and save."""
        self.record.rounds.append(RecordedRound(**asdict(round_), seconds=seconds))
        self.record.search_evaluations += round_.evaluations
        self.record.timing.search += seconds
        self.save()

    def scores_on(self, stage: Literal["confirm", "verify"], items: int) -> Scored:
        """The confirmation's or the verification's scores on ``items`` items, started anew when absent or measured
        on another number of items: those scores do not apply."""
        scored = getattr(self.record, stage)
        if scored is None or scored.items != items:
            scored = Confirmation(items) if stage == "confirm" else Scored(items)
            setattr(self.record, stage, scored)
        return scored

    def memoised(
        self, store: dict[str, Measured], scorer: Callable[[frozenset], float]
    ) -> Callable[[Iterable[int]], float]:
        """``score(linear layers)`` that looks in ``store`` first (keyed by :func:`hybrid_key`) and otherwise
        scores, records the score with its seconds and saves the state."""

        def score(linear: Iterable[int]) -> float:
            key = hybrid_key(linear)
            if key not in store:
                start = time.perf_counter()
                value = scorer(frozenset(linear))
                store[key] = Measured(value, time.perf_counter() - start)
                self.save()
            return store[key].score

        return score
