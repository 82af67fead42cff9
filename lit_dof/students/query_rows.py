"""Which query rows a layer-wise loss scores (:mod:`lit_dof.students.losses`).

Each row's softmax loss is independent of the others given the keys, so a loss may score R of the T rows of a
sequence. Drawn uniformly (``query_rows: R``), the scored positions follow the training blocks: on blocks of 2,048
tokens only a quarter of the rows fall in the first 512 positions, where a student trained on 512-token blocks
put all of them. :class:`StratifiedRows` draws the rows in equal shares from position strata instead, so that one
fit on long blocks trains the near positions as much as the far ones: its loss is the mean of the per-stratum
mean row losses, a position-balanced objective (stratified sampling with equal weights per stratum, not an
unbiased estimate of the uniform all-row loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class StratifiedRows:
    """Score ``count`` query rows per sequence, drawn in equal shares from the position strata
    [0, b₁), [b₁, b₂), …, [b_k, T) (``bounds`` = b₁ < … < b_k), uniformly without replacement within each.

    The strata are those that hold a position of the sequence (a sequence of T ≤ b₁ tokens has one stratum: the
    uniform draw). ``count`` is split as evenly as the strata allow, the first strata taking the remainder; a
    stratum shorter than its share gives all its rows, so the sequence scores fewer than ``count``.

    Args:
        count: R ≥ 1, the rows scored per sequence (at least one per stratum: ``count`` ≥ k + 1).
        bounds: the strata's inner edges, strictly increasing positions ≥ 1 (token indices); empty: one stratum.

    Raises:
        ValueError: a ``count`` that is not an integer ≥ k + 1, or ``bounds`` that are not strictly increasing
            integers ≥ 1.
    """

    count: int
    bounds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        bounds = tuple(self.bounds)
        object.__setattr__(self, "bounds", bounds)
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bounds) or any(
            a >= b for a, b in zip(bounds, bounds[1:])
        ):
            raise ValueError(f"query_rows.bounds must be strictly increasing integers >= 1, got {list(bounds)}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < len(bounds) + 1:
            raise ValueError(
                f"query_rows.count must be an integer >= {len(bounds) + 1} (one row per stratum at least), "
                f"got {self.count!r}"
            )

    def __str__(self) -> str:
        return f"{self.count} in equal shares from the strata split at {list(self.bounds)}"

    def strata(self, T: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` position ranges of a T-token sequence, in order."""
        edges = [0, *(b for b in self.bounds if b < T), T]
        return list(zip(edges, edges[1:]))

    def select(self, T: int, generator: torch.Generator | None = None) -> Tensor:
        """The scored positions of a T-token sequence: ``(R,)`` int64, sorted, distinct, R ≤ ``count``."""
        strata, draw_on = self.strata(T), None if generator is None else generator.device
        share, extra = divmod(self.count, len(strata))
        picked = []
        for i, (start, stop) in enumerate(strata):
            n = share + (i < extra)
            picked.append(start + torch.randperm(stop - start, generator=generator, device=draw_on)[:n])
        return torch.cat(picked).sort().values


def scored_rows(T: int, query_rows: int | StratifiedRows | None) -> int:
    """At most how many rows of a T-token sequence a loss scores (the memory plan's R)."""
    count = query_rows.count if isinstance(query_rows, StratifiedRows) else query_rows
    return T if count is None else min(count, T)


def select_rows(T: int, query_rows: int | StratifiedRows | None, generator: torch.Generator | None, device) -> Tensor:
    """The query rows a loss scores in a T-token sequence: ``(R,)`` int64 positions, sorted, on ``device``.

    Args:
        T: tokens per sequence.
        query_rows: ``None`` (all T rows), R (R rows drawn uniformly without replacement) or a
            :class:`StratifiedRows`.
        generator: the draws' RNG (a CPU generator draws on the CPU).
        device: where the positions go.
    """
    if query_rows is None or (not isinstance(query_rows, StratifiedRows) and query_rows >= T):
        return torch.arange(T, device=device)
    if isinstance(query_rows, StratifiedRows):
        return query_rows.select(T, generator).to(device)
    draw_on = None if generator is None else generator.device  # a CPU generator draws on the CPU
    idx = torch.randperm(T, generator=generator, device=draw_on)[:query_rows].sort().values
    return idx.to(device)
