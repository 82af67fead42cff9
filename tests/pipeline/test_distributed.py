"""Distributed training on CPU: DDP and sharded (FSDP2, the shipped ``trainer/fsdp.yaml``) with 2 processes
(gloo). Every rank writes what it sees (:class:`~tests.pipeline.rank_probe.RankProbe`), so the tests compare
ranks — not only exit codes. One uninterrupted fit per strategy is shared by the tests of this module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from lit_dof.students import load_student
from lit_dof.teacher.loading import load_teacher
from tests.conftest import REPO, TINYSTORIES
from tests.pipeline.conftest import fit_args

STEPS, KILL_AT = 4, 3
CPU = ["--trainer.accelerator=cpu", "--trainer.devices=2"]
# (config files, arguments): fsdp2 is the shipped config with only the CPU flags (bf16 is another matter)
STRATEGIES = {
    "ddp": ((), [*CPU, "--trainer.strategy=ddp"]),
    "fsdp2": (("trainer/fsdp.yaml",), [*CPU, "--trainer.precision=32-true"]),
    "fsdp2_bf16_true": (("trainer/fsdp.yaml",), CPU),  # the shipped precision
    "ddp_lora": (("trainer/ddp.yaml", "methods/lora.yaml"), [*CPU, "--trainer.precision=32-true"]),
    "fsdp2_lora": (("trainer/fsdp.yaml", "methods/lora.yaml"), [*CPU, "--trainer.precision=32-true"]),
}
PROBE = "tests.pipeline.rank_probe.RankProbe"


def _fit(cwd: Path, strategy: str, extra=(), steps: int = STEPS, check: bool = True) -> subprocess.CompletedProcess:
    """``lit-dof fit`` with 2 CPU processes in ``cwd`` (the configs' relative checkpoint folders land there)."""
    configs, args = STRATEGIES[strategy]
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = fit_args(cwd, *configs, steps=steps, extra=[*args, *extra])
    command = [sys.executable, "-m", "lit_dof", *args]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def _probe(out: Path, event: str) -> list[dict]:
    """What both ranks wrote at ``event``."""
    return [torch.load(out / f"{event}_rank{rank}.pt", weights_only=False) for rank in (0, 1)]


def _assert_equal_twins(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), (key, (a[key].double() - b[key].double()).abs().max())


def _exported(run: Path, version: int):
    """The student exported by the fit logged as ``version`` in ``run`` (exactly one: rank 0 exports)."""
    students = list(run.glob(f"*/version_{version}/student/model.safetensors"))
    assert len(students) == 1, students
    return load_student(students[0].parent)


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def reference(request, tmp_path_factory):
    """An uninterrupted fit of ``STEPS`` steps (the strategy's own callbacks plus a probe): (strategy, run dir,
    its process)."""
    run = tmp_path_factory.mktemp(f"reference_{request.param}")
    probe = f'--trainer.callbacks+={{"class_path": "{PROBE}", "init_args": {{"out_dir": "{run / "probe"}"}}}}'
    return request.param, run, _fit(run, request.param, [probe])


@pytest.mark.slow
def test_two_process_training(reference):
    """Both ranks plan the same student (DoF report, dims) and hold bit-equal twins at the start and after
    training; under FSDP2 every teacher parameter starts as a sharded DTensor and the twins are plain tensors;
    rank 0 exports one student, whose teacher weights equal the single-process teacher's."""
    strategy, run, done = reference
    assert f"max_steps={STEPS}` reached" in done.stdout + done.stderr
    for event in ("start", "end"):
        rank0, rank1 = _probe(run / "probe", event)
        assert rank0["step"] == rank1["step"] == (0 if event == "start" else STEPS)
        assert rank0["feature_dims"] == rank1["feature_dims"] and rank0["dof"] == rank1["dof"] is not None
        _assert_equal_twins(rank0["twins"], rank1["twins"])
        assert not rank0["sharded_twins"]
    if strategy == "fsdp2":  # at the start: after a forward the root module keeps its own parameters gathered
        assert _probe(run / "probe", "start")[0]["replicated_teacher"] == []
    else:
        assert rank0["replicated_teacher"]
    student = _exported(run, version=0)
    assert student.feature_dims == rank0["feature_dims"] and all(m >= 8 for m in student.feature_dims)
    exported = student.state_dict()  # the frozen teacher comes back whole and unchanged (every rank's shard)
    for key, value in load_teacher(str(TINYSTORIES))[0].state_dict().items():
        assert torch.equal(exported[f"model.{key}"], value), key
    ids = torch.randint(3, 2000, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(student(ids).logits).all()


@pytest.mark.slow
def test_shipped_fsdp_config_in_bf16(tmp_path):
    """configs/trainer/fsdp.yaml as shipped (bf16-true) on 2 CPU processes: the student records the teacher's
    bf16 and keeps float32 feature maps (master weights)."""
    _fit(tmp_path, "fsdp2_bf16_true", steps=2)
    student = _exported(tmp_path, version=0)
    assert student.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for n, p in student.named_parameters() if ".feature_map." in n)
    ids = torch.randint(3, 2000, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(student(ids).logits).all()


@pytest.mark.slow
def test_killed_two_process_run_resumes_bit_equal(reference, tmp_path):
    """Killed after step 3 (last checkpoint: step 2, twins only), resumed with ``--ckpt_path last``: both ranks
    end bit-equal to the uninterrupted fit, and so does the exported student."""
    strategy, ref_run, _ = reference
    killed = _fit(tmp_path, strategy, _callbacks(tmp_path, KILL_AT), check=False)
    assert killed.returncode != 0 and f"killed after step {KILL_AT}" in killed.stderr, killed.stderr[-6000:]
    rank0, rank1 = _probe(tmp_path / "probe", "killed")
    _assert_equal_twins(rank0["twins"], rank1["twins"])
    _assert_twins_only_checkpoint(tmp_path / "ckpt" / "last.ckpt", step=2)
    _fit(tmp_path, strategy, [*_callbacks(tmp_path, 0), "--ckpt_path=last"])
    for resumed, uninterrupted in zip(_probe(tmp_path / "probe", "end"), _probe(ref_run / "probe", "end")):
        assert resumed["step"] == uninterrupted["step"] == STEPS
        _assert_equal_twins(resumed["twins"], uninterrupted["twins"])
    _assert_equal_twins(_exported(tmp_path, version=1).state_dict(), _exported(ref_run, version=0).state_dict())


def _callbacks(run: Path, kill_at: int, every: int = 2) -> list[str]:
    """A config file of the fit's callbacks: checkpoints in ``run/ckpt`` every ``every`` steps (Lightning runs
    them after the probe, so a kill after step s leaves the checkpoint of the step before) and the probe in
    ``run/probe``, killing the run after ``kill_at`` (0: never)."""
    path = run / f"callbacks_{kill_at}.yaml"
    checkpoint = {"dirpath": str(run / "ckpt"), "save_last": True, "every_n_train_steps": every, "save_top_k": 0}
    probe = {"out_dir": str(run / "probe"), "kill_at": kill_at}
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": checkpoint},
        {"class_path": PROBE, "init_args": probe},
    ]
    run.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return ["--config", str(path)]


def _assert_twins_only_checkpoint(path: Path, step: int) -> None:
    """``path`` (a file under DDP, a DCP folder under FSDP2) holds the twins' weights and no teacher weight."""
    if path.is_dir():
        from torch.distributed.checkpoint import FileSystemReader

        saved = FileSystemReader(path).read_metadata().state_dict_metadata
        keys = [k.removeprefix("state_dict.") for k in saved if k.startswith("state_dict.")]
        assert torch.load(path / "meta.pt", weights_only=False)["global_step"] == step
    else:
        checkpoint = torch.load(path, weights_only=False)
        keys = list(checkpoint["state_dict"])
        assert checkpoint["global_step"] == step
    assert keys and all(".lit_dof." in k for k in keys), [k for k in keys if ".lit_dof." not in k][:5]


@pytest.mark.slow
@pytest.mark.parametrize("reference", ["fsdp2"], indirect=True)
def test_shipped_fsdp_config_resumes_to_more_steps(reference, tmp_path):
    """The bar: ``trainer/fsdp.yaml`` with only the CPU flags fits (the reference) and a second fit with
    ``--ckpt_path last`` and a larger ``max_steps`` resumes from its last checkpoint, in the same version
    directory, and reaches it."""
    import shutil

    strategy, reference_run, _ = reference
    run = tmp_path / "run"
    shutil.copytree(reference_run, run)  # the resumed fit continues (and re-exports) in place: keep the reference
    last = run / "fsdp" / "version_0" / "checkpoints" / "last.ckpt"
    _assert_twins_only_checkpoint(last, step=STEPS)
    done = _fit(run, strategy, ["--ckpt_path=last"], steps=STEPS + 2)
    assert f"Restoring states from the checkpoint path at {last.resolve()}" in done.stdout + done.stderr
    assert f"max_steps={STEPS + 2}` reached" in done.stdout + done.stderr


@pytest.mark.slow
def test_distributed_dof_equals_one_process_over_the_union(reference):
    """Each rank captured its share of the DoF batches (global batch g on rank g % 2, from its own shard) and
    the reservoirs were merged: the report equals one process's over the same keyed batches."""
    import json

    from torch.utils.data import DataLoader

    from lit_dof.data.corpus import iter_documents
    from lit_dof.data.datamodule import PackedBlocks
    from lit_dof.dof.report import collect_samples, dof_report
    from tests.conftest import WIKIPEDIA

    _, run, _ = reference
    report = json.loads(next(run.rglob("version_0/dof.json")).read_text())
    teacher, tokenizer = load_teacher(str(TINYSTORIES))
    batches, keys = [], []
    for rank in (0, 1):  # TINY_ARGS: num_batches 2, batch_size 2, seq_len 64
        blocks = PackedBlocks(lambda: iter_documents(WIKIPEDIA), tokenizer, 64, "train", 100, rank=rank, world_size=2)
        batches.append(next(iter(DataLoader(blocks, batch_size=2))))
        keys.append(rank)
    reservoir, tokens = collect_samples(teacher, batches, 64, keys=keys, progress=False)
    alone = dof_report(teacher, reservoir, tokens, "auto", progress=False)
    assert report["tokens"] == tokens == 2 * 2 * 64
    torch.testing.assert_close(torch.tensor(report["head_dof"]), torch.tensor(alone.head_dof), rtol=1e-9, atol=0)
    assert report["lam"] == pytest.approx(alone.lam, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp_lora", "fsdp2_lora"])
def test_lora_tail_under_the_shipped_distributed_configs(tmp_path, strategy):
    """The quickstart's LoRA tail (here on the tests' pure linear student) under the shipped ddp.yaml and fsdp.yaml
    on 2 CPU processes: both ranks hold bit-equal adapters of the full projections at the start and the end (under
    FSDP2 the teacher's weights are shards, the adapters replicated), the tail trained them (B ≠ 0), and the
    exported student's projections are the teacher's plus (α/r)·B·A of the final adapters (the merge's closed
    form)."""
    probe = f'--trainer.callbacks+={{"class_path": "{PROBE}", "init_args": {{"out_dir": "{tmp_path / "probe"}"}}}}'
    _fit(tmp_path, strategy, [probe])
    full = load_teacher(str(TINYSTORIES))[0]
    for event in ("start", "end"):
        rank0, rank1 = _probe(tmp_path / "probe", event)
        assert len(rank0["lora"]) == 4 * 2 * len(rank0["feature_dims"])  # A and B on q/k/v/o of every layer
        _assert_equal_twins(rank0["lora"], rank1["lora"])
        for name, tensor in rank0["lora"].items():  # A: r × in, B: out × r of the full projection
            base = full.get_submodule(name.split(".lora_")[0].removeprefix("model."))
            assert tuple(tensor.shape) == ((8, base.in_features) if ".lora_A." in name else (base.out_features, 8))
    assert "tail" in rank0["phases"] and any(t.abs().max() > 0 for n, t in rank0["lora"].items() if ".lora_B." in n)
    exported = _exported(tmp_path, version=0).state_dict()
    teacher = full.state_dict()
    with safe_open(next(tmp_path.glob("*/version_0/student/model.safetensors")), "pt") as saved:
        assert not [key for key in saved.keys() if "lora_" in key or "base_layer" in key]  # merged, not saved
    for name, a in rank0["lora"].items():
        if ".lora_A." in name:
            base = name.split(".lora_A.")[0]  # student.model.<teacher module>
            b = rank0["lora"][f"{base}.lora_B.default.weight"]
            teacher_key = base.removeprefix("model.") + ".weight"
            expected = teacher[teacher_key] + (16.0 / 8) * b @ a
            torch.testing.assert_close(exported[f"{base}.weight"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_lora_tail_killed_inside_the_tail_under_fsdp2_resumes_bit_equal(tmp_path):
    """Item 4's exact resume: the LoRA tail under the shipped fsdp.yaml, killed after the tail's second step (6
    steps, the last 2 end to end; the checkpoint of step 5 holds one tail step's adapters and optimizer state),
    resumed with ``--ckpt_path last``: both ranks end with the twins and adapters of the uninterrupted run, bit for
    bit, and the exported (merged) students are equal."""
    steps, kill_at = 6, 6
    reference, run = tmp_path / "reference", tmp_path / "run"
    _fit(reference, "fsdp2_lora", _callbacks(reference, 0, every=1), steps=steps)
    killed = _fit(run, "fsdp2_lora", _callbacks(run, kill_at, every=1), steps=steps, check=False)
    assert killed.returncode != 0 and f"killed after step {kill_at}" in killed.stderr, killed.stderr[-6000:]
    assert torch.load(run / "ckpt" / "last.ckpt" / "meta.pt", weights_only=False)["global_step"] == kill_at - 1
    rank0, _ = _probe(run / "probe", "killed")
    assert rank0["phases"][-2:] == ["tail", "tail"]  # the checkpoint is inside the tail
    _fit(run, "fsdp2_lora", [*_callbacks(run, 0, every=1), "--ckpt_path=last"], steps=steps)
    ends = zip(_probe(run / "probe", "end"), _probe(reference / "probe", "end"))
    for resumed, uninterrupted in ends:
        assert resumed["step"] == uninterrupted["step"] == steps
        _assert_equal_twins(resumed["twins"], uninterrupted["twins"])
        _assert_equal_twins(resumed["lora"], uninterrupted["lora"])
    _assert_equal_twins(_exported(run, version=1).state_dict(), _exported(reference, version=0).state_dict())
