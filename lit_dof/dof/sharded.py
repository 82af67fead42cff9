"""The per-layer DoF computation split across the ranks of a process group (issue "Scale for real", item 5).

Rank r computes :func:`~lit_dof.dof.estimator.degrees_of_freedom` for layers r, r + world, … — on its own
accelerator when given one — and the ranks exchange the results, so every rank ends with every layer's
per-head DoF while each did 1 / world of the Gram/eigen work. Each layer is still computed whole by one rank
from the same samples, so the result is the one a single process computes.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from lit_dof.dof.estimator import RelativeTo, degrees_of_freedom


def sharded_head_dof(
    x: Tensor,
    lam: float,
    *,
    relative_to: RelativeTo | None = None,
    group=None,
    device: torch.device | str | None = None,
    split: bool = True,
    progress: bool = False,
) -> Tensor:
    """Per-head DoF of every layer, each layer computed by one rank of ``group``.

    Args:
        x: ``(L, H, J, d)`` pooled query/key samples of L layers (identical on every rank, e.g. after
            :meth:`~lit_dof.teacher.capture.QKReservoir.all_gather`).
        lam: the ridge λ, as in :func:`~lit_dof.dof.estimator.degrees_of_freedom`.
        relative_to: as in :func:`~lit_dof.dof.estimator.degrees_of_freedom`.
        group: the process group (``None``: the default group; one process when torch.distributed is not
            initialised — then every layer is computed here).
        device: where this rank runs its layers' eigen work (e.g. its GPU); results come back to the CPU.
        split: ``False`` computes every layer here even in an initialised process group (a caller on one rank).
        progress: a progress bar over this rank's layers.

    Returns:
        ``(L, H)`` float64 DoF, equal on every rank.

    Raises:
        ValueError: as :func:`~lit_dof.dof.estimator.degrees_of_freedom`.
    """
    distributed = split and torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world = (
        (torch.distributed.get_rank(group), torch.distributed.get_world_size(group)) if distributed else (0, 1)
    )
    mine = {}
    for index in tqdm(range(rank, x.shape[0], world), desc="degrees of freedom", unit="layer", disable=not progress):
        layer = x[index] if device is None else x[index].to(device)
        mine[index] = degrees_of_freedom(layer, lam, relative_to=relative_to).cpu()
    if world == 1:
        parts = [mine]
    else:
        parts = [None] * world
        torch.distributed.all_gather_object(parts, mine, group=group)
    merged = {index: heads for part in parts for index, heads in part.items()}
    return torch.stack([merged[index] for index in range(x.shape[0])])
