"""The orderings that need no search, compared with the greedy search's at equal numbers of linear layers
(Distill-then-Replace, arXiv 2601.11667; METHOD.md §6): DoF-guided, local-loss-guided, uniform and random.
An ordering lists the candidate layers, the first replaced first; its first ``k`` layers are its hybrid with
``k`` linear layers.
"""

from __future__ import annotations

import random
from typing import Sequence

ORDERINGS = ("greedy", "dof", "loss", "uniform", "random")
"""The orderings the held-out comparison can draw, in report order."""


def default_counts(most_linear: int, num_layers: int) -> list[int]:
    """Four evenly spaced counts of linear layers up to the greedy search's most-linear hybrid (at least 4)."""
    top = max(most_linear, min(4, num_layers))
    return sorted({max(1, round(top * j / 4)) for j in range(1, 5)})


def dof_order(layer_dof: dict[int, float]) -> list[int]:
    """Lowest DoF first (the paper's finding that low-DoF layers need few features suggests they linearise
    best); ties by layer index."""
    return sorted(layer_dof, key=lambda i: (layer_dof[i], i))


def loss_order(local_loss: dict[int, float]) -> list[int]:
    """Lowest local distillation loss first (the best-approximated layers)."""
    return sorted(local_loss, key=lambda i: (local_loss[i], i))


def uniform_order(layers: Sequence[int]) -> list[int]:
    """Evenly interleaved: each prefix of the order spreads its layers as uniformly as possible over the
    stack (a bit-reversal-like refinement: ends and middle first, then the gaps between them)."""
    layers = list(layers)
    n = len(layers)
    order: list[int] = []
    chosen: set[int] = set()
    for k in range(1, n + 1):
        # positions of k evenly spaced layers; add the ones not chosen yet, nearest-to-centre first
        targets = [round(j * (n - 1) / max(1, k - 1)) if k > 1 else (n - 1) // 2 for j in range(k)]
        for t in sorted(targets, key=lambda t: abs(t - (n - 1) / 2)):
            if t not in chosen:
                chosen.add(t)
                order.append(layers[t])
    order += [layers[i] for i in range(n) if i not in chosen]
    return order


def random_order(layers: Sequence[int], seed: int = 0) -> list[int]:
    """A seeded random permutation."""
    order = list(layers)
    random.Random(seed).shuffle(order)
    return order


def all_orders(
    greedy: list[int], layer_dof: dict[int, float], local_loss: dict[int, float], layers: Sequence[int], seed: int
) -> dict[str, list[int]]:
    """Every ordering of :data:`ORDERINGS` by name: ``greedy`` (the search's chosen layers, round by round) and
    the four that need no search over ``layers``."""
    return {
        "greedy": greedy,
        "dof": dof_order(layer_dof),
        "loss": loss_order(local_loss),
        "uniform": uniform_order(layers),
        "random": random_order(layers, seed),
    }
