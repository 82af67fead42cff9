"""The per-layer DoF split across 2 gloo processes: each rank computes only its layers, all get the
single-process result."""

from __future__ import annotations

import socket

import torch
import torch.multiprocessing as mp

from lit_dof.dof import estimator, sharded
from lit_dof.dof.sharded import sharded_head_dof


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, x: torch.Tensor, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    seen = []
    original = estimator.degrees_of_freedom

    def counting(layer, lam, **kwargs):
        seen.append(next(i for i in range(len(x)) if torch.equal(x[i], layer)))
        return original(layer, lam, **kwargs)

    sharded.degrees_of_freedom = counting
    try:
        heads = sharded_head_dof(x, 0.5, relative_to="trace")
    finally:
        sharded.degrees_of_freedom = original
        torch.distributed.destroy_process_group()
    torch.save({"heads": heads, "seen": seen}, f"{out}/rank{rank}.pt")


def test_sharded_dof_splits_layers_and_equals_one_process(tmp_path):
    x = torch.randn(5, 3, 40, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # 5 layers
    mp.spawn(_rank, args=(2, _free_port(), x, str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert results[0]["seen"] == [0, 2, 4] and results[1]["seen"] == [1, 3]  # each layer computed once
    alone = torch.stack([estimator.degrees_of_freedom(layer, 0.5, relative_to="trace") for layer in x])
    for result in results:
        assert torch.equal(result["heads"], alone)
    assert torch.equal(sharded_head_dof(x, 0.5, relative_to="trace"), alone)  # no process group: all layers here
