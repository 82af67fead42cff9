"""Window dropout: on a random share of the layer-wise steps every sliding-window twin is trained with its exact
window cut short, so its far term has to carry the keys the window would have held.

Windowed students of the LoLCATs kind were shown to *bypass* their linear part — they lean on the exact window and
leave the far term doing little (arXiv 2510.05901, whose remedies are dropping the window at random during training
and larger feature dims). With a cut window the teacher's attention rows are unchanged, so the far term's share of
every row grows to include the keys between ``window`` and the twin's own window: it is trained on more of the
attention mass, at the distances just past the cut. The sinks stay exact. The end-to-end tail is not affected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from torch import nn

from lit_dof.attention.layers.sliding_window import sliding_window_layers


@dataclass(frozen=True)
class WindowDropout:
    """Cut every twin's window to ``window`` tokens on a random share ``rate`` of the layer-wise steps.

    Args:
        rate: the probability of a step being cut, in [0, 1].
        window: the cut window w' ≥ 1 (tokens attended exactly, the query's own included; the sinks stay).
        seed: the draws' seed; a step's draw depends on (seed, step, batch index) only, so a resumed run draws the
            same cuts.

    Raises:
        ValueError: ``rate`` outside [0, 1] or ``window`` < 1.
    """

    rate: float = 0.25
    window: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 <= self.rate <= 1:
            raise ValueError(f"window_dropout.rate must be a probability in [0, 1], got {self.rate!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window_dropout.window must be an integer >= 1, got {self.window!r}")

    def cuts(self, step: int, batch_idx: int) -> bool:
        """Whether the layer-wise step ``step`` (its micro-batch ``batch_idx``) is trained with the cut window."""
        return random.Random(f"{self.seed}/{step}/{batch_idx}").random() < self.rate

    @contextlib.contextmanager
    def applied(self, twins: Iterable[nn.Module], step: int, batch_idx: int) -> Iterator[bool]:
        """Inside the block, every sliding-window twin (per-head groups included) whose window exceeds
        ``window`` attends exactly to ``window`` tokens when :meth:`cuts` says so; restored on exit, also on error.

        Args:
            twins: the student's linear layers.
            step: the optimizer step.
            batch_idx: the micro-batch.

        Yields:
            whether this step is cut.
        """
        cut = self.cuts(step, batch_idx)
        changed = []
        layers = [layer for twin in twins for layer in sliding_window_layers(twin)] if cut else []
        for layer in layers:
            options = layer.sliding_window
            if options.window > self.window:
                changed.append((layer, options))
                layer.sliding_window = dataclasses.replace(options, window=self.window)
        try:
            yield cut
        finally:
            for layer, options in changed:
                layer.sliding_window = options
