"""What the stages of one hybrid search share (:class:`Workspace`) and the greedy search's per-round record
(:class:`RoundLog`): :mod:`lit_dof.hybrid.run` builds both."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lit_dof.hybrid.items import Items
from lit_dof.hybrid.search import Round, Tolerance
from lit_dof.hybrid.state import SearchState
from lit_dof.progress import Progress


@dataclass
class Workspace:
    """What the stages of one search share: the run directory, the record, the bank, the items, the rule.

    Attributes:
        out: the run directory. state: its ``search.json``. student, tokenizer: the bank, loaded.
        candidates: the layers that have a twin. items: the scored data. rule: the acceptance rule.
    """

    out: Path
    state: SearchState
    student: torch.nn.Module
    tokenizer: object
    candidates: list[int]
    items: Items
    rule: Tolerance

    @property
    def num_layers(self) -> int:
        """Decoder layers of the bank."""
        return len(self.student.linear_layers)


class RoundLog:
    """``on_round`` of the greedy search: records each finished round with its wall time, logs the passed ones to
    TensorBoard and, with ``progress``, prints the round (k of at most n, its choice, elapsed time, ETA) on stderr."""

    def __init__(
        self, state: SearchState, logger: TensorBoardLogger, num_layers: int, progress: Progress | None = None
    ) -> None:
        self.state, self.logger, self.num_layers, self.progress = state, logger, num_layers, progress
        self.started = time.perf_counter()

    def __call__(self, round_: Round) -> None:
        """Record ``round_`` in ``search.json`` with its wall time (seconds); log it if it passed.

        Args:
            round_: the finished round of the greedy search.
        """
        self.state.add_round(round_, time.perf_counter() - self.started)
        if round_.passed:
            fraction = len(round_.linear) / self.num_layers
            self.logger.log_metrics(
                {
                    "search/score": round_.score,
                    "search/linear_fraction": fraction,
                    "search/chosen_layer": round_.chosen,
                    "search/evaluations": round_.evaluations,
                },
                step=len(round_.linear),
            )
            self.logger.save()
        if self.progress is not None:
            done = f"layer {round_.chosen} linear, score {round_.score:.4f}" if round_.passed else "no swap passes"
            self.progress.end(f"{done} ({len(round_.linear)} linear, {round_.evaluations} evaluations)")
        self.started = time.perf_counter()
