"""A rehearsal of the Llama-3-8B recipe on CPU: the shipped tiny config of the same family (32 layers, 32 query
heads, 8 KV heads; random weights built here) through the shipped ``configs/models/llama-3-8b.yaml`` with
``configs/trainer/fsdp.yaml`` (bf16-true) and ``configs/trainer/ddp.yaml`` (bf16-mixed; also bf16-true), only the
CPU flags and tiny budgets added, on 2 processes (gloo) and as 2 "nodes" on localhost (the launch scripts, under
torchrun and under a stand-in ``srun``, and ``MASTER_ADDR``/``NODE_RANK``). Every fit estimates the DoF, trains
layer-wise, validates, runs an end-to-end tail and exports; every rank writes what it saw
(:class:`~tests.pipeline.rank_probe.RankProbe`)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_dof.students import load_student
from lit_dof.teacher.random_init import LLAMA_3_8B_TINY, materialise_random_teacher
from tests.conftest import REPO, TINYSTORIES, WIKIPEDIA

STEPS, VAL_EVERY = 4, 2  # validation after steps 2 and 4; finetune_fraction 0.5: steps 2 and 3 are the tail
LAUNCH = REPO / "scripts" / "launch"
LLAMA_8B = REPO / "configs" / "models" / "llama-3-8b.yaml"
PROBE = "tests.pipeline.rank_probe.RankProbe"
VENV_BIN = str(Path(sys.executable).parent)  # torchrun and lit-dof of the interpreter running the tests


def _recipe(teacher: Path, run: Path) -> list[str]:
    """The overrides of a rehearsal: the tiny teacher, local data, a few small steps, validation and a tail,
    logs and the probe in ``run`` (the strategy's relative checkpoint folder lands in the working directory)."""
    probe = json.dumps({"class_path": PROBE, "init_args": {"out_dir": str(run / "probe")}})
    return [
        f"--model.init_args.teacher={teacher}", f"--data.init_args.path={WIKIPEDIA}",
        "--data.init_args.seq_len=64", "--data.init_args.batch_size=1", "--data.init_args.val_blocks=2",
        "--model.init_args.planner.init_args.num_samples=64", "--model.init_args.planner.init_args.num_batches=2",
        "--model.init_args.query_rows=16",
        "--model.init_args.finetune_fraction=0.5", f"--trainer.max_steps={STEPS}",
        f"--trainer.val_check_interval={VAL_EVERY}", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={run}", f"--trainer.callbacks+={probe}",
    ]  # fmt: skip  # compact list


def _env(**extra: str) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", **extra}  # fmt: skip  # compact dict


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_all(commands: list[tuple[list[str], dict]], cwd: Path, timeout: float = 500) -> list[str]:
    """Start every command at once (the "nodes" of one job), wait for all; their outputs. A failure or a
    timeout kills the others' process groups (a node left alone would wait in the rendezvous)."""
    cwd.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen(c, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c, e in commands]  # fmt: skip  # compact comprehension
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
            assert proc.returncode == 0, out[-8000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return outputs


def _fit_two_processes(teacher: Path, run: Path, trainer_config: str, precision: str) -> str:
    """``lit-dof fit`` with the shipped 8B model config and ``trainer_config``, 2 CPU processes."""
    args = ["fit", "--config", str(LLAMA_8B), "--config", str(REPO / "configs" / "trainer" / trainer_config),
            "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.precision", precision,
            *_recipe(teacher, run)]  # fmt: skip  # compact list
    return _run_all([([sys.executable, "-m", "lit_dof.pipeline.cli", *args], _env())], run)[0]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """The tiny Llama-3-8B-family teacher with random weights and TinyStories-656K's tokenizer."""
    return materialise_random_teacher(tmp_path_factory.mktemp("teacher") / "llama-3-8b-tiny", TINYSTORIES)


def _assert_rehearsal(run: Path, teacher_dtype: torch.dtype, world: int = 2) -> None:
    """What every rehearsal must show: both ranks planned the same student (DoF report, 32 feature dims) and
    hold bit-equal float32 twins at the start and the end; each ran 2 layer-wise then 2 tail steps on its own
    blocks (no block seen by both), validated after steps 2 and 4 and logged the same global perplexities;
    rank 0 exported one student that loads, in the teacher's dtype with float32 twins equal to the trained ones."""
    probes = {
        e: [torch.load(run / "probe" / f"{e}_rank{r}.pt", weights_only=False) for r in range(world)]
        for e in ("start", "end")
    }
    for event, ranks in probes.items():
        first = ranks[0]
        assert len(first["feature_dims"]) == 32 and all(m >= 1 for m in first["feature_dims"])
        assert first["dof"] is not None and len(first["dof"]["head_dof"]) == 32
        for other in ranks[1:]:
            assert other["step"] == first["step"] == (0 if event == "start" else STEPS)
            assert other["feature_dims"] == first["feature_dims"] and other["dof"] == first["dof"]
            assert first["twins"].keys() == other["twins"].keys() and first["twins"]
            for name, value in first["twins"].items():
                assert value.dtype == torch.float32, name
                assert torch.equal(value, other["twins"][name]), name
    start, end = probes["start"][0], probes["end"]
    assert any(not torch.equal(start["twins"][n], v) for n, v in end[0]["twins"].items())  # training moved them
    for rank in end:
        assert rank["phases"] == ["layerwise"] * 2 + ["tail"] * 2
        assert rank["validated_at"] == [VAL_EVERY, STEPS]
        for key in ("val/ppl_student", "val/ppl_teacher", "train/logit_kd"):
            assert math.isfinite(rank["metrics"][key]), (key, rank["metrics"])
        for key in ("val/ppl_student", "val/ppl_teacher"):  # exact global perplexity: the same on every rank
            assert rank["metrics"][key] == end[0]["metrics"][key], key
        assert len(rank["input_ids"]) == STEPS and all(ids.shape == (1, 64) for ids in rank["input_ids"])
    blocks = [{tuple(row.tolist()) for ids in rank["input_ids"] for row in ids} for rank in end]
    assert sum(len(b) for b in blocks) == len(set().union(*blocks)) == world * STEPS  # disjoint across ranks
    students = list(run.glob("*/version_0/student"))
    assert len(students) == 1, students
    student = load_student(students[0])
    assert student.dtype == teacher_dtype and student.feature_dims == end[0]["feature_dims"]
    exported = {n: p for n, p in student.state_dict().items() if ".lit_dof." in n}
    assert exported.keys() == end[0]["twins"].keys()
    for name, value in exported.items():
        assert value.dtype == torch.float32 and torch.equal(value, end[0]["twins"][name]), name
    with torch.no_grad():
        assert torch.isfinite(student(torch.randint(3, 2000, (1, 12))).logits).all()


def test_tiny_config_has_the_8b_layout(teacher):
    """The tiny config keeps Llama-3-8B's family, depth, head layout (GQA 4:1), untied embeddings and RoPE base
    and only shrinks widths; the materialised model loads as a teacher with the tokenizer's vocabulary."""
    from lit_dof.teacher.families import attention_layers
    from lit_dof.teacher.loading import load_teacher

    tiny = json.loads((LLAMA_3_8B_TINY / "config.json").read_text())
    full = json.loads((REPO / "configs" / "models" / "llama-3-8b" / "config.json").read_text())
    for key in ("architectures", "model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "hidden_act", "tie_word_embeddings", "rope_theta", "rms_norm_eps",
                "attention_bias"):  # fmt: skip  # packed loop header
        assert tiny[key] == full[key], key
    assert tiny["hidden_size"] < full["hidden_size"] and tiny["intermediate_size"] < full["intermediate_size"]
    model, tokenizer = load_teacher(str(teacher))
    layers = attention_layers(model)
    assert len(layers) == 32 and layers[0].head_dim == 8
    assert model.config.vocab_size == len(tokenizer) == 2048
    assert 15e6 < sum(p.numel() for p in model.parameters()) < 25e6


def test_random_teacher_rejects_a_tokenizer_of_another_vocabulary(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    spec = json.loads((LLAMA_3_8B_TINY / "config.json").read_text())
    (config / "config.json").write_text(json.dumps({**spec, "vocab_size": 4096}))
    with pytest.raises(ValueError, match="2048 tokens but .* vocab_size 4096"):
        materialise_random_teacher(tmp_path / "out", TINYSTORIES, config)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_rehearsal_fsdp_bf16_true(teacher, tmp_path):
    """The shipped fsdp.yaml (bf16-true, sharded at LlamaDecoderLayer) on 2 CPU processes."""
    _fit_two_processes(teacher, tmp_path, "fsdp.yaml", "bf16-true")
    _assert_rehearsal(tmp_path, torch.bfloat16)
    assert (tmp_path / "fsdp" / "version_0" / "checkpoints" / "last.ckpt").is_dir()  # DCP folder, in the run's own


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_rehearsal_ddp(teacher, tmp_path, precision):
    """The shipped ddp.yaml on 2 CPU processes: as shipped (bf16-mixed, a float32 teacher under autocast) and
    with the replicated bf16 teacher docs/scale.md suggests for 8B under DDP (bf16-true)."""
    _fit_two_processes(teacher, tmp_path, "ddp.yaml", precision)
    _assert_rehearsal(tmp_path, torch.bfloat16 if precision == "bf16-true" else torch.float32)
    assert (tmp_path / "ddp" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_rehearsal_two_nodes_with_the_torchrun_script(teacher, tmp_path):
    """scripts/launch/torchrun.sh run twice on localhost, NODE_RANK 0 and 1, one CPU rank per "node": the
    script's own fsdp.yaml command line with the CPU flags added."""
    port = str(_free_port())
    nodes = [(["bash", str(LAUNCH / "torchrun.sh"), "--trainer.accelerator=cpu", "--trainer.precision=bf16-true",
               *_recipe(teacher, tmp_path)],
              _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NNODES="2", NODE_RANK=str(rank), GPUS_PER_NODE="1"))
             for rank in (0, 1)]  # fmt: skip  # compact comprehension
    outputs = _run_all(nodes, tmp_path)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in outputs[0] and "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    _assert_rehearsal(tmp_path, torch.bfloat16)


@pytest.mark.slow
def test_rehearsal_two_nodes_with_node_rank(teacher, tmp_path):
    """``lit-dof fit`` with ddp.yaml started once per "node" with MASTER_ADDR / MASTER_PORT / NODE_RANK and
    ``--trainer.num_nodes 2 --trainer.devices 1`` (the multi-node recipe of ddp.yaml's header)."""
    port = str(_free_port())
    args = ["fit", "--config", str(LLAMA_8B), "--config", str(REPO / "configs" / "trainer" / "ddp.yaml"),
            "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "2",
            "--trainer.precision", "bf16-mixed", *_recipe(teacher, tmp_path)]  # fmt: skip  # compact list
    nodes = [([sys.executable, "-m", "lit_dof.pipeline.cli", *args],
              _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank))) for rank in (0,
              1)]  # fmt: skip  # compact comprehension
    outputs = _run_all(nodes, tmp_path)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in outputs[0] and "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    _assert_rehearsal(tmp_path, torch.float32)


FAKE_SRUN = """#!/usr/bin/env bash
# srun on one machine: SLURM_NTASKS tasks, task i on "node" i, with the variables srun gives each task
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NODEID=$i "$@" > "task$i.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
"""


@pytest.mark.slow
def test_rehearsal_two_nodes_with_the_slurm_script(teacher, tmp_path):
    """scripts/launch/slurm.sbatch as a 2-node job with one task per node, ``srun`` replaced by a local stand-in
    that starts the tasks with SLURM's variables: Lightning's SLURMEnvironment assigns the ranks and accepts the
    script's ``--trainer.num_nodes`` / ``--trainer.devices``."""
    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    env = _env(SRUN=str(srun), LIT_DOF_REPO=str(REPO), SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="4242",
               SLURM_JOB_NAME="lit-dof-8b", SLURM_JOB_NUM_NODES="2", SLURM_NNODES="2", SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="1", SLURM_NODELIST="127.0.0.1",
               MASTER_PORT=str(_free_port()))  # fmt: skip  # packed args
    env.pop("MASTER_ADDR", None)
    done = subprocess.run(["bash", str(LAUNCH / "slurm.sbatch"), "--trainer.accelerator=cpu",
                           "--trainer.precision=bf16-true", *_recipe(teacher, tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=500)  # fmt: skip  # packed args
    logs = [(tmp_path / f"task{rank}.log").read_text() for rank in (0, 1)]
    assert done.returncode == 0, done.stderr[-2000:] + logs[0][-4000:] + logs[1][-4000:]
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in logs[0] and "GLOBAL_RANK: 1, MEMBER: 2/2" in logs[1]
    _assert_rehearsal(tmp_path, torch.bfloat16)


@pytest.mark.parametrize("script", ["torchrun.sh", "slurm.sbatch"])
def test_launch_script_command_line_parses(script, tmp_path):
    """Each launch script is valid bash, and the ``lit-dof`` command line it builds parses as ``fit`` would and
    plans the 8B recipe over 2 nodes × 8 GPUs (``SUBCOMMAND=plan``: the same arguments, no launcher)."""
    path = LAUNCH / script
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True)
    env = _env(SUBCOMMAND="plan", NNODES="2", GPUS_PER_NODE="8", SLURM_JOB_NUM_NODES="2",
               SLURM_NTASKS_PER_NODE="8(x2)", PG_TIMEOUT="0:45:00",
               HF_HOME=str(tmp_path / "no-hf-home"))  # fmt: skip  # packed args
    env.pop("SLURM_SUBMIT_DIR", None)
    done = subprocess.run(["bash", str(path), "--data.init_args.seq_len=1024"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip  # packed args
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert "meta-llama/Meta-Llama-3-8B: 8.030 B parameters, 32 layers" in lines[0]
    assert lines[1].startswith("run: 16 rank(s) (8 gpu x 2 node(s)), teacher FSDP2-sharded; B 1 x T 1024")
    assert 1 < float(lines[-1].split()[1].split("=")[1]) < 80


def test_launch_script_rejects_an_unknown_subcommand(tmp_path):
    done = subprocess.run(["bash", str(LAUNCH / "torchrun.sh")], cwd=tmp_path, env=_env(SUBCOMMAND="validate"),
                          capture_output=True, text=True, timeout=60)  # fmt: skip  # packed args
    assert done.returncode == 2 and "SUBCOMMAND must be fit or plan" in done.stderr
