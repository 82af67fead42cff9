"""The record of a hybrid search, ``<out>/search.json``: its settings, then every measured number, written
atomically as soon as it exists (so a killed search resumes where it stopped), and :func:`hybrid_key`, the
name of a hybrid in it. :mod:`lit_dof.hybrid.run` writes the record; :mod:`lit_dof.hybrid.report` reads it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lit_dof.hybrid.search import Round
from lit_dof.io import atomic_write_json

SEARCH_FILE = "search.json"
"""The record's file name inside a search's ``out`` directory."""


def hybrid_key(linear: Iterable[int]) -> str:
    """The key of a hybrid in ``search.json``: its sorted linear layers, comma-separated (``"teacher"``: none)."""
    return ",".join(str(i) for i in sorted(linear)) or "teacher"


class SearchState:
    """``search.json``: settings, then every measured number, written atomically on each change.

    Args:
        path: the record's file; read when it exists, else started empty (``rounds``, ``heldout``, ``timing``).
        settings: what the numbers depend on; an existing record must have been written with the same.

    Attributes:
        data: the record (a JSON-ready dict; the search adds to it in place).

    Raises:
        ValueError: ``path`` was written with other settings (names the ones that differ).
    """

    def __init__(self, path: Path, settings: dict) -> None:
        self.path = path
        if path.is_file():
            self.data = json.loads(path.read_text())
            if self.data.get("settings") != settings:
                changed = sorted(k for k in settings if self.data.get("settings", {}).get(k) != settings[k])
                raise ValueError(
                    f"{path} was written with other settings ({', '.join(changed)}): pass a new --out or delete it"
                )
        else:
            self.data = {"settings": settings, "rounds": [], "heldout": {}, "timing": {}}

    def save(self) -> None:
        """Write the record (atomically)."""
        atomic_write_json(self.path, self.data)

    def timed(self, key: str, seconds: float) -> None:
        """Add ``seconds`` to ``timing[key]``."""
        self.data["timing"][key] = self.data["timing"].get(key, 0.0) + seconds

    def add_round(self, round_: Round, seconds: float) -> None:
        """Append a finished round of the greedy search with its wall time, count its evaluations, and save."""
        self.data["rounds"].append({**round_.__dict__, "seconds": seconds})
        self.data["search_evaluations"] = self.data.get("search_evaluations", 0) + round_.evaluations
        self.timed("search", seconds)
        self.save()

    def saved_rounds(self) -> list[dict]:
        """The recorded rounds without their timing: what :func:`~lit_dof.hybrid.search.greedy_replacement`
        replays on resume."""
        return [{k: v for k, v in r.items() if k != "seconds"} for r in self.data["rounds"]]

    def scores_on(self, name: str, items: int) -> dict:
        """``data[name]`` (``{"items": items, "scores": {...}}`` plus what the caller adds), emptied first when
        it was measured on another number of items: those scores do not apply."""
        entry = self.data.setdefault(name, {})
        if entry.get("items") != items:
            entry.clear()
            entry.update(items=items, scores={})
        return entry

    def memoised(self, store: dict, scorer: Callable[[frozenset], float]) -> Callable[[Iterable[int]], float]:
        """``score(linear layers)`` that looks in ``store`` first (keyed by :func:`hybrid_key`) and otherwise
        scores, records ``{"score", "seconds"}`` and saves the state."""

        def score(linear: Iterable[int]) -> float:
            key = hybrid_key(linear)
            if key not in store:
                start = time.perf_counter()
                value = scorer(frozenset(linear))
                store[key] = {"score": value, "seconds": time.perf_counter() - start}
                self.save()
            return store[key]["score"]

        return score
