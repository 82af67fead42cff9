"""FSDP2's plain tensors: the twins and LoRA adapters that FSDP does not manage, replicated over the data-parallel
group (broadcast from its rank 0 once, gradients all-reduced each step), and the meshes involved."""

from __future__ import annotations

from typing import Callable

import torch


def fsdp_mesh(dp):
    """``dp`` (a 1-D data-parallel mesh) over the same ranks, its dimension named ``fsdp``: only there does peft
    size a DTensor weight's LoRA adapter from the full shape (other names read as tensor parallelism)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dp.get_group(), dp.device_type, mesh_dim_names=("fsdp",))


def data_parallel(mesh):
    """The data-parallel sub-mesh of a Lightning device mesh (the whole mesh when it has no named dimensions)."""
    return mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh


def coalesced(tensors: list[torch.Tensor], collective: Callable, **kwargs) -> None:
    """Run ``collective(flat, **kwargs)`` (an in-place ``torch.distributed`` collective) once on the
    concatenation of ``tensors`` and copy the result back into them (nothing to do for none)."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    collective(flat, **kwargs)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def all_reduce_mean(tensor: torch.Tensor, group) -> None:
    """All-reduce ``tensor`` to its mean over ``group``: SUM, then divide (gloo has no AVG)."""
    torch.distributed.all_reduce(tensor, group=group)
    tensor /= torch.distributed.get_world_size(group)
