"""Progress lines of long commands (``lit-dof compare``'s cells, ``lit-dof hybrid``'s stages and rounds) on stderr:
item k of n, what it is, the time elapsed and an estimate of the time left.

    [compare] cell 3/12 C=64 dof · elapsed 0:21:04 · ETA ≈ 0:58:40

The estimate is the mean wall time of the items finished so far that did work (at least ``min_seconds``: a resumed
run skips finished items in no time, which would make the estimate far too small) × the items left; ``ETA –`` until
one has finished.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def clock_text(seconds: float) -> str:
    """``H:MM:SS`` of a non-negative duration (seconds, rounded down)."""
    seconds = int(max(0.0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts ``total`` items of a command and prints one line per event on ``stream``.

    Args:
        command: the prefix, e.g. ``"compare"`` (printed as ``[compare]``).
        total: how many items there are (an upper bound is fine: the hybrid search may stop early).
        unit: what an item is called, e.g. ``"cell"``.
        stream: where lines go (default: ``sys.stderr`` at each print, so pytest's capture sees them).
        clock: seconds, monotonic (tests pass their own).
        min_seconds: items that took less are counted as done but not used for the estimate.

    Raises:
        ValueError: ``total < 0``.
    """

    def __init__(
        self,
        command: str,
        total: int,
        unit: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_seconds: float = 1.0,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.command, self.total, self.unit, self.stream = command, total, unit, stream
        self.clock, self.min_seconds = clock, min_seconds
        self.started = self.clock()
        self.done = 0
        self.worked: list[float] = []  # wall times of the finished items that did work
        self._item_started: float | None = None
        self._ended = self.started  # when the last item finished

    def eta(self) -> float | None:
        """Seconds left by the estimate (see the module docstring), ``None`` before any item did work."""
        if not self.worked:
            return None
        return sum(self.worked) / len(self.worked) * max(0, self.total - self.done)

    def _print(self, text: str) -> None:
        eta = self.eta()
        left = "–" if eta is None else f"≈ {clock_text(eta)}"
        timing = f"elapsed {clock_text(self.clock() - self.started)} · ETA {left}"
        print(f"[{self.command}] {text} · {timing}", file=self.stream or sys.stderr, flush=True)

    def begin(self, label: str) -> None:
        """Start the next item and print ``unit k/total label``.

        Args:
            label: what the item is (``"C=64 dof"``).
        """
        self._finish_open_item()
        self._item_started = self.clock()
        self._print(f"{self.unit} {self.done + 1}/{self.total} {label}")

    def end(self, label: str | None = None) -> None:
        """Finish the current item (one started by :meth:`begin`, else the one since the previous :meth:`end` or
        the start) and, with ``label``, print ``unit k/total done: label``.

        Args:
            label: what it did (``"layer 7 linear, score 0.61"``), or ``None`` to print nothing.
        """
        started = self._item_started if self._item_started is not None else self._ended
        self._record(self.clock() - started)
        if label is not None:
            self._print(f"{self.unit} {self.done}/{self.total} done: {label}")

    def note(self, text: str) -> None:
        """Print ``text`` with the elapsed time and the estimate."""
        self._print(text)

    def _record(self, seconds: float) -> None:
        self.done += 1
        if seconds >= self.min_seconds:
            self.worked.append(seconds)
        self._item_started = None
        self._ended = self.clock()

    def _finish_open_item(self) -> None:
        if self._item_started is not None:
            self._record(self.clock() - self._item_started)
