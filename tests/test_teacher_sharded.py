"""A teacher loaded sharded over 2 gloo processes (lit_dof.teacher.sharded): rank 0 loads, rank 1 builds it on the
meta device and never loads it whole; both hold shards whose full state equals the single-process teacher's, give
its logits, and capture the same DoF sample as one process (an odd number of batches: padded forwards)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from lit_dof.teacher import loading
from tests.conftest import TINYSTORIES

DTYPES = [torch.float32, torch.bfloat16]
IDS = torch.tensor([[1, 45, 300, 7, 1022, 88, 5, 640, 31, 2], [1, 9, 9, 120, 4, 2000, 17, 3, 250, 61]])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    loads = []
    original = loading.load_teacher
    loading.load_teacher = lambda *args, **kwargs: loads.append(args) or original(*args, **kwargs)
    try:
        for dtype in DTYPES:
            _load_and_probe(rank, dtype, loads, f"{out}/{dtype}_rank{rank}.pt")
    finally:
        loading.load_teacher = original
        torch.distributed.destroy_process_group()


def _load_and_probe(rank: int, dtype: torch.dtype, loads: list, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from lit_dof.attention import LearnedPRF
    from lit_dof.dof.report import collect_samples
    from lit_dof.students.modeling import linearize
    from lit_dof.teacher.sharded import load_sharded_teacher, pad_sharded_forwards, reshard

    loads.clear()
    teacher, tokenizer = load_sharded_teacher(str(TINYSTORIES), init_device_mesh("cpu", (2,)), dtype=dtype)
    params = dict(teacher.named_parameters())
    placements = {n: (isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),)) for n, p in params.items()}
    local = sum(p.to_local().numel() for p in params.values())
    with torch.no_grad():
        logits = teacher(IDS, use_cache=False).logits
    # DoF capture: 3 keyed batches, global batch g on rank g % 2; rank 1 pads one forward
    keys = list(range(rank, 3, 2))
    reservoir, tokens = collect_samples(teacher, [IDS[:, : 6 + g] for g in keys], 16, keys=keys, progress=False)
    pad_sharded_forwards(teacher, 2 - len(keys), torch.device("cpu"))
    reservoir.all_gather()
    reshard(teacher)
    linearize(teacher, LearnedPRF, 4, seed=0)  # as configure_model does next: its post_init must not re-init
    full = get_model_state_dict(teacher, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    full = {k: v for k, v in full.items() if ".lit_dof." not in k}
    samples = [reservoir.samples(i) for i in range(len(teacher.model.layers))]
    torch.save({"loads": len(loads), "placements": placements, "local": local, "logits": logits, "full": full,
                "samples": samples, "buffers": dict(teacher.named_buffers()), "vocab": len(tokenizer),
                "dtypes": {p.dtype for p in params.values()}}, path)  # fmt: skip  # packed dict


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """One 2-process run that loads the teacher sharded in each of :data:`DTYPES`: what each rank saw."""
    out = tmp_path_factory.mktemp("sharded_teacher")
    mp.spawn(_rank, args=(_free_port(), str(out)), nprocs=2, join=True)
    return {dtype: [torch.load(out / f"{dtype}_rank{r}.pt", weights_only=False) for r in range(2)] for dtype in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES)
def test_sharded_teacher_equals_the_single_process_teacher(sharded_runs, dtype):
    """Rank 1 never loads the teacher; every parameter is a dim-0 shard in the asked dtype; rank 0's gathered full
    state (after the twins are attached, as in configure_model), rank 1's buffers and both ranks' logits equal the
    single-process teacher's, bit for bit."""
    ranks = sharded_runs[dtype]
    teacher, tokenizer = loading.load_teacher(str(TINYSTORIES), dtype=dtype)
    assert [r["loads"] for r in ranks] == [1, 0]  # rank 1 never loaded the teacher whole
    total = sum(p.numel() for p in teacher.parameters())
    for r in ranks:
        assert all(r["placements"].values()) and r["dtypes"] == {dtype} and r["vocab"] == len(tokenizer)
        assert r["local"] <= total // 2 + 2 * len(r["placements"]) * teacher.config.hidden_size  # a shard + padding
    reference = teacher.state_dict()
    assert ranks[0]["full"].keys() == reference.keys() and ranks[1]["full"] == {}  # cpu_offload: rank 0 only
    for key, value in reference.items():
        assert torch.equal(ranks[0]["full"][key], value), key
    for name, buffer in teacher.named_buffers():
        assert torch.equal(ranks[1]["buffers"][name], buffer), name
    with torch.no_grad():
        logits = teacher(IDS, use_cache=False).logits
    for r in ranks:
        torch.testing.assert_close(r["logits"], logits, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dof_capture_on_the_sharded_teacher_equals_one_process(sharded_runs, dtype):
    """3 keyed batches over 2 ranks (rank 1 pads a forward): the merged q/k sample equals one process's."""
    from lit_dof.dof.report import collect_samples

    teacher, _ = loading.load_teacher(str(TINYSTORIES), dtype=dtype)
    alone, _ = collect_samples(teacher, [IDS[:, : 6 + g] for g in range(3)], 16, keys=list(range(3)), progress=False)
    for r in sharded_runs[dtype]:
        for layer, samples in enumerate(r["samples"]):
            torch.testing.assert_close(samples, alone.samples(layer), rtol=0, atol=0)
