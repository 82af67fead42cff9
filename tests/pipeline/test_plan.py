"""``lit-dof plan``: the estimate against measured peaks on CPU, devices, the 8B recipe offline, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lit_dof.pipeline.architecture import PlanError, resolve_teacher_config
from lit_dof.pipeline.cli import parse_fit_config, plan_main
from lit_dof.pipeline.plan import GIB
from lit_dof.pipeline.plan_report import plan_config
from lit_dof.students.query_rows import StratifiedRows
from tests.conftest import REPO, TINYSTORIES, WIKIPEDIA
from tests.pipeline.conftest import BASE

LLAMA_FSDP = [
    "--config",
    str(REPO / "configs/models/llama-3-8b.yaml"),
    "--config",
    str(REPO / "configs/trainer/fsdp.yaml"),
]
MEASURED = [  # a few layer-wise steps only: no DoF estimate, validation, tail or export
    "--config", str(BASE),
    f"--data.init_args.path={WIKIPEDIA}", "--model.init_args.planner=lit_dof.pipeline.planner.FixedPlanner",
    "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
    "--model.init_args.export_dir=", "--model.init_args.finetune_fraction=0", "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]  # fmt: skip  # compact list
CASES = {
    # TinyStories with every query row scored: the loss graphs dominate (2 layers of 4 x 8 x 512 x 512)
    "tinystories": [f"--model.init_args.teacher={TINYSTORIES}", "--data.init_args.seq_len=512",
                    "--data.init_args.batch_size=4", "--model.init_args.query_rows=null"],
    # the same with one backward of the summed loss: both layers' loss graphs alive at once
    "tinystories-summed": [f"--model.init_args.teacher={TINYSTORIES}", "--data.init_args.seq_len=512",
                           "--data.init_args.batch_size=4", "--model.init_args.query_rows=null",
                           "--model.init_args.layer_backward=false"],
    # the quickstart's layer-wise step on the embedded SmolLM2 (B 2 x T 512, 128 rows): weights + one graph
    "smollm2": [],
    # end-to-end steps of a sliding-window + linear student (window 64, 4 sinks, the shipped recipe): every layer's
    # activations, the exact band's logits included, alive for one backward
    "tinystories-tail-window": [f"--model.init_args.teacher={TINYSTORIES}", "--data.init_args.seq_len=512",
                                "--data.init_args.batch_size=8", "--model.init_args.sliding_window.window=64",
                                "--model.init_args.sliding_window.sink_tokens=4",
                                "--model.init_args.finetune_fraction=1", "--trainer.max_steps=3"],
}  # fmt: skip  # compact dict
PHASE = {"tinystories-tail-window": "tail"}  # the phase each case measures (default: layerwise)


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **extra}


def _estimated_step_bytes(args: list[str], phase: str = "layerwise") -> int:
    """The plan's host bytes of ``phase`` without the runtime constant (the probe subtracts the imports)."""
    _, run, phases = plan_config(parse_fit_config(args))
    assert run.accelerator == "cpu" and not run.sharded
    steps = next(p for p in phases if p.name == phase)
    return sum(size for term, size in steps.host.items() if not term.startswith("runtime"))


@pytest.mark.parametrize(
    "case",
    ["tinystories", "tinystories-summed", "tinystories-tail-window", pytest.param("smollm2", marks=pytest.mark.slow)],
)
def test_layerwise_estimate_matches_measured_peak(case, tmp_path, request):
    """Peak resident memory of real layer-wise steps (a subprocess: its imports subtracted, high-water mark
    reset after the first step) is within 25% of the independent estimate. glibc's dynamic mmap threshold is
    pinned so that freed tensors leave the resident set (the peak is the tensors', not the heap's history)."""
    if case == "smollm2":
        request.getfixturevalue("smollm2_dir")  # converted once; the plan reads its config, the fit its weights
    args = [*MEASURED, *CASES[case], f"--trainer.logger.init_args.save_dir={tmp_path}"]
    out = tmp_path / "memory.json"
    subprocess.run([sys.executable, "-m", "tests.pipeline.memory_probe", str(out), *args], cwd=REPO, check=True,
                   env=_env(MALLOC_MMAP_THRESHOLD_="65536"), capture_output=True,
                   timeout=300)  # fmt: skip  # packed args
    probe = json.loads(out.read_text())
    measured = probe["peak"] - probe["baseline"]
    estimated = _estimated_step_bytes(args, PHASE.get(case, "layerwise"))
    assert measured > 0.1 * GIB  # a real workload, not noise
    assert abs(estimated - measured) <= 0.25 * measured, (case, estimated / GIB, measured / GIB)


def test_llama_3_8b_fsdp_on_8_gpus_fits_offline():
    """The bar: the shipped 8B recipe under fsdp.yaml on 8 GPUs plans below 80 GiB per GPU with no network
    (the architecture comes from configs/models/llama-3-8b/config.json), in a fresh process."""
    result = subprocess.run([sys.executable, "-m", "lit_dof", "plan", *LLAMA_FSDP,
                             "--trainer.devices", "8"],
                            cwd=REPO, env=_env(HF_HUB_OFFLINE="1", HF_HOME=str(REPO / "no-such-hf-home")),
                            capture_output=True, text=True, timeout=120, check=True)  # fmt: skip  # packed args
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("plan peak_gpu_gib=") and " host_gib=" in last
    gpu = float(last.split()[1].split("=")[1])
    assert 5 < gpu < 80
    assert "8.030 B parameters, 32 layers" in result.stdout and "phase layerwise" in result.stdout


def test_sharded_plan_shrinks_with_devices_and_nodes(capsys):
    """FSDP: more ranks, a smaller teacher shard, strictly less per GPU; tokens per step grow with the ranks.
    DDP replicates the teacher: the peak does not depend on the device count."""
    peaks, tokens = [], []
    for devices, nodes in ((1, 1), (2, 1), (8, 1), (8, 2)):
        _, run, phases = plan_config(
            parse_fit_config([*LLAMA_FSDP, "--trainer.devices", str(devices), "--trainer.num_nodes", str(nodes)])
        )
        peaks.append(max(p.device_total() for p in phases if p.runs))
        tokens.append(next(p for p in phases if p.name == "layerwise").tokens)
        assert run.world_size == devices * nodes
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks)
    assert tokens == [2048, 4096, 16384, 32768]
    ddp = [REPO / "configs/models/llama-3-8b.yaml", REPO / "configs/trainer/ddp.yaml"]
    replicated = {
        plan_main(["--config", str(ddp[0]), "--config", str(ddp[1]), "--trainer.devices", str(n)]).splitlines()[-1]
        for n in (1, 8)
    }
    assert len(replicated) == 1
    capsys.readouterr()


def test_stratified_query_rows_parse_from_the_command_line_and_plan_as_their_count(tmp_path):
    tiny = [*MEASURED, f"--model.init_args.teacher={TINYSTORIES}", "--data.init_args.seq_len=512"]
    tiny.append(f"--trainer.logger.init_args.save_dir={tmp_path}")
    _, run, phases = plan_config(
        parse_fit_config([*tiny, "--model.init_args.query_rows={count: 96, bounds: [64, 256]}"])
    )
    assert run.query_rows == StratifiedRows(count=96, bounds=(64, 256))
    _, _, uniform = plan_config(parse_fit_config([*tiny, "--model.init_args.query_rows=96"]))
    assert [p.host for p in phases] == [p.host for p in uniform]
    assert "96 in equal shares from the strata split at [64, 256]" in plan_main(
        [*tiny, "--model.init_args.query_rows={count: 96, bounds: [64, 256]}"]
    )


def test_teacher_config_without_weights(smollm2_dir):
    """The embedded alias resolves from its cached conversion (or GGUF metadata), a directory from its
    config.json, a hub id from the shipped architecture file."""
    assert resolve_teacher_config("smollm2-135m-instruct").num_hidden_layers == 30
    assert resolve_teacher_config(str(TINYSTORIES)).num_hidden_layers == 2
    llama = resolve_teacher_config("meta-llama/Meta-Llama-3-8B")
    assert (llama.hidden_size, llama.num_key_value_heads, llama.vocab_size) == (4096, 8, 128256)


def test_bad_input_is_a_clear_error(capsys, tmp_path, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:  # fsdp.yaml says devices -1: the count is the machine's
        plan_main(LLAMA_FSDP)
    assert exit_info.value.code == 2 and "--trainer.devices 8" in capsys.readouterr().err
    with pytest.raises(PlanError, match="no config.json"):
        resolve_teacher_config(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PlanError, match="ship its config.json"):
        resolve_teacher_config("no-such-org/no-such-model-xyz")


def test_lora_adapters_and_their_optimizer_state_are_counted():
    """The quickstart's LoRA tail adds its adapters' float32 bytes, counted here from peft's own injection into the
    teacher's architecture, to the plan's trainable weights, and three times that to the optimizer state."""
    import torch
    from transformers import AutoModelForCausalLM

    from lit_dof.students.lora import LoRA, add_lora

    with_lora = plan_config(parse_fit_config(["--config", str(REPO / "configs" / "quickstart.yaml")]))
    without = plan_config(
        parse_fit_config(["--config", str(REPO / "configs" / "quickstart.yaml"), "--model.init_args.lora=null"])
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(resolve_teacher_config(with_lora[1].teacher))
    add_lora(model, LoRA(rank=8))
    adapters = sum(p.numel() * 4 for n, p in model.named_parameters() if ".lora_" in n)
    assert with_lora[1].lora_rank == 8 and without[1].lora_rank == 0
    tail, tail0 = ({**p.device, **p.host} for plan in (with_lora, without) for p in plan[2] if p.name == "tail")
    assert tail["twins"] - tail0["twins"] == adapters
    assert tail["optimizer state"] - tail0["optimizer state"] == 3 * adapters
