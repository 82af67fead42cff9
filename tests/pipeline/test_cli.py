"""The lit-dof CLI: every YAML parses; swapping methods changes only config; outputs are complete."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from lit_dof.pipeline.cli import build_cli
from lit_dof.students import load_student
from tests.conftest import REPO
from tests.pipeline.cards import check_card_of_the_fit
from tests.pipeline.conftest import fit_args

PLANNER = "--model.init_args.planner.init_args"
CONFIGS = sorted(  # every fit config: configs/compare/ holds lit-dof compare's rows (tests/comparison)
    p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.yaml") if p.parent.name != "compare"
)


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_parses(config):
    """Complete files (model and data chosen) parse alone; method and trainer files parse composed on top of
    a model file, as users use them."""
    path = REPO / "configs" / config
    content = yaml.safe_load(path.read_text())
    standalone = all("class_path" in (content.get(key) or {}) for key in ("model", "data"))
    base = [] if standalone else ["--config", str(REPO / "configs/models/smollm2-135m.yaml")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        build_cli(["fit", *base, "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    resolved = yaml.safe_load(out.getvalue())
    assert resolved["model"]["class_path"].startswith(("lit_dof.pipeline.", "lit_dof.evaluation."))
    assert "tokenizer" not in resolved["data"]["init_args"]  # a link target: set from model.teacher
    assert "seq_len" not in resolved["model"]["init_args"]  # a link target: set from data.seq_len
    assert {"plan_files", "metrics_file", "trainer"} <= set(resolved) and not {"dof", "allocator"} & set(resolved)
    if resolved["model"]["class_path"].endswith("Distillation"):  # a student module: its planner resolved
        planner = resolved["model"]["init_args"]["planner"]
        assert planner["class_path"] in ("lit_dof.pipeline.planner.DoFPlanner", "lit_dof.pipeline.planner.FixedPlanner")


def test_the_removed_dof_and_allocator_groups_point_to_the_planner(tmp_path, capsys):
    """A config or option of the groups the planner replaced is refused with the way to migrate it."""
    old = tmp_path / "config.yaml"  # e.g. a run's saved config from before the planners
    old.write_text("dof: {lam: auto, num_batches: 4}\nallocator: {strategy: fix}\n")
    for extra, named in ((["--config", str(old)], f"dof: ({old}), allocator: ({old})"), (["--dof.lam=2"], "--dof.lam")):
        with pytest.raises(SystemExit) as exit_info:
            build_cli(fit_args(tmp_path, extra=extra))
        error = capsys.readouterr().err
        assert exit_info.value.code == 2 and named in error and "--model.init_args.planner.init_args.<key>" in error


def _run(tmp_path, *configs, steps=3, extra=()):
    cli = build_cli(fit_args(tmp_path, *configs, steps=steps, extra=extra))
    return cli, Path(cli.trainer.log_dir)


@pytest.mark.parametrize(
    "method, feature_map, strategy",
    [
        ("methods/dof.yaml", "LearnedPRF", "dof"),
        ("methods/dof_clip.yaml", "LearnedPRF", "dof_clip"),
        ("methods/fix.yaml", "LearnedPRF", "fix"),
        ("methods/performer.yaml", "PerformerFeatureMap", "fix"),
        ("methods/dijiang.yaml", "DiJiangFeatureMap", "fix"),
        ("methods/hedgehog.yaml", "HedgehogFeatureMap", "fix"),
    ],
)
def test_method_swap_is_config_only(tmp_path, method, feature_map, strategy):
    cli, log_dir = _run(tmp_path, method)
    assert cli.datamodule.tokenizer_name == cli.model.teacher_name and cli.model.seq_len == cli.datamodule.seq_len == 64
    report = json.loads((log_dir / "dof.json").read_text())
    student = load_student(log_dir / "student")
    twins = student.linear_modules()
    assert {type(t.feature_map).__name__ for t in twins.values()} == {feature_map}
    if strategy == "fix":
        assert student.feature_dims == [16, 16]
    else:  # the report's allocation with the quickstart's min_dim=8 floor
        assert student.feature_dims == [max(8, m) for m in report["allocations"][strategy]]
    card = (log_dir / "student" / "README.md").read_text()  # rewritten after the export with what the run knows
    assert f"Strategy: `{strategy}`" in card and f"`{feature_map}`" in card and "λ = " in card
    assert cli.trainer.global_step == 3
    assert bool(cli.model.trainable_parameters()) == (feature_map != "PerformerFeatureMap")  # Performer: untrained
    assert (log_dir / "config.yaml").is_file() and list(log_dir.glob("events.out.tfevents.*"))
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["val/ppl_student"]) and torch.isfinite(metrics["val/ppl_teacher"])


@pytest.mark.parametrize(
    "method, sinks, far_term",
    [
        ("methods/swa_linear.yaml", 0, True),
        ("methods/swa_sink_linear.yaml", 4, True),
        ("methods/swa_sink.yaml", 4, False),
    ],
)
def test_sliding_window_methods_fit_and_export(tmp_path, method, sinks, far_term):
    """Window + linear recipes train the feature maps and the far-term weights in the windowed configuration
    (layer-wise, then the end-to-end tail); the window-only controls train nothing. The window is cut to 16
    so that the 64-token test blocks have a far part."""
    cli, log_dir = _run(tmp_path, method, extra=["--model.init_args.sliding_window.window=16"])
    student = load_student(log_dir / "student")
    options = student.config.window_options
    assert (options["window"], options["sink_tokens"], options["far_term"]) == (16, sinks, far_term)
    twins = student.linear_modules()
    assert {type(t).__name__ for t in twins.values()} == {"SlidingWindowLinearAttention"}
    assert all(t.window == 16 and t.sink_tokens == sinks for t in twins.values())
    if far_term:
        assert all(t.log_mix is not None and t.log_mix.abs().sum() > 0 for t in twins.values())  # β trained
        report = json.loads((log_dir / "dof.json").read_text())  # DoF-allocated dims, the quickstart's floor of 8
        assert student.feature_dims == [max(8, m) for m in report["allocations"]["dof"]]
    else:
        assert all(t.log_mix is None for t in twins.values())
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["val/ppl_student"]) and torch.isfinite(metrics["val/ppl_teacher"])


@pytest.mark.parametrize(
    "method, window", [("methods/lolcats.yaml", 16), ("methods/lora.yaml", 0), ("methods/lora.yaml", 16)]
)
def test_lora_recipes_train_adapters_in_the_tail_and_export_merged(tmp_path, method, window):
    """LoRA adapters stay zero through the layer-wise steps, train in the end-to-end tail, are kept in the
    (teacher-free) checkpoint and merged into the exported student, which loads without peft."""
    from lit_dof.teacher.loading import load_teacher
    from tests.conftest import TINYSTORIES

    extra = [f"--model.init_args.sliding_window.window={window}"] if window else []
    cli, log_dir = _run(tmp_path, method, steps=3, extra=extra)  # 2 layer-wise steps, 1 tail step
    names = [n for n, _ in cli.model.trainable_parameters()]
    assert any(".lora_" in n for n in names)  # the live model keeps its adapters; the export holds them merged
    checkpoint = torch.load(next(Path(tmp_path).rglob("last.ckpt")), weights_only=False)["state_dict"]
    lora = [k for k in checkpoint if ".lora_" in k]
    assert lora and all(".lit_dof." in k or ".lora_" in k for k in checkpoint)  # no teacher weights
    assert any(checkpoint[k].abs().sum() > 0 for k in lora if ".lora_B." in k)  # B left 0 only by no training
    student = load_student(log_dir / "student")
    assert not any("lora" in k for k in student.state_dict())
    teacher, _ = load_teacher(TINYSTORIES)
    q_student = student.model.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q_student, teacher.model.layers[0].self_attn.q_proj.weight)  # the merged update
    assert student.config.window_options["window"] == window
    check_card_of_the_fit(cli, log_dir / "student", student)


def test_planner_budget_scales_every_strategy(tmp_path):
    """The planner's ``budget`` = mean dim per layer: Fix gets it everywhere, DoF keeps the total L · budget."""
    fix, _ = _run(tmp_path / "fix", "methods/fix.yaml", steps=1, extra=[f"{PLANNER}.budget=6"])
    assert fix.model.student.feature_dims == [6, 6]
    dof, log_dir = _run(
        tmp_path / "dof", "methods/dof.yaml", steps=1, extra=[f"{PLANNER}.budget=40", f"{PLANNER}.min_dim=1"]
    )
    report = json.loads((log_dir / "dof.json").read_text())
    ratio = torch.tensor(report["layer_dof"]) / torch.tensor(report["layer_dof"]).mean()
    assert dof.model.student.feature_dims == [max(1, round(40 * float(r))) for r in ratio]


def test_direct_and_l2_phases_run(tmp_path):
    for configs in (("methods/direct.yaml",), ("methods/l2.yaml",), ("methods/output.yaml",)):
        cli, log_dir = _run(tmp_path / configs[0].split("/")[1], *configs, steps=2)
        assert cli.trainer.global_step == 2 and (log_dir / "student" / "model.safetensors").is_file()
        recipe = (log_dir / "student" / "README.md").read_text().split("- Recipe: ")[1].splitlines()[0]
        if configs[0] == "methods/direct.yaml":  # every step end to end; its loss is not a layer loss
            assert recipe.startswith("`DirectDistillation` (lit-dof): every step end to end (next-token cross-entropy")
        else:
            assert recipe.startswith(
                f"`LayerwiseDistillation` (lit-dof): each twin learns its teacher layer's "
                f"attention (`{type(cli.model.layer_loss).__name__}`), then the last 1 of 2 steps"
            )


def test_dof_json_and_tensorboard_contents(tmp_path):
    cli, log_dir = _run(tmp_path, steps=2)
    report = json.loads((log_dir / "dof.json").read_text())
    assert len(report["head_dof"]) == 2 and len(report["head_dof"][0]) == 8  # TinyStories: 2 layers × 8 heads
    assert sum(report["allocations"]["dof"]) in range(31, 34)  # 2 × 16 up to rounding
    assert report["lam_rule"] == "auto" and report["num_samples"] == 64
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"images": 0, "tensors": 0}).Reload()
    tags = events.Tags()
    assert {"dof/heads", "dof/feature_dims"} <= set(tags["images"])
    assert {p.name for p in (log_dir / "figures").iterdir()} == {
        "dof_heads.png",
        "dof_feature_dims.png",
        "dof_table.md",
    }
    assert {"train/loss_layer_00", "train/loss_layer_01", "val/ppl_student", "val/ppl_teacher"} <= set(tags["scalars"])


def test_end_to_end_tail_follows_the_layerwise_phase(tmp_path):
    """``finetune_fraction=0.5`` of 4 steps: steps 0–1 layer-wise (per-layer losses), steps 2–3 logit
    distillation from a fresh Adam state at ``finetune_lr_ratio`` × the base learning rates."""
    import lightning as L

    seen = {}

    class Spy(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen[trainer.global_step] = [None, trainer.optimizers[0].param_groups[0]["lr"]]

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):  # after the optimizer step
            optimizer = trainer.optimizers[0]
            z = next(p for g in optimizer.param_groups if g["name"] == "z" for p in g["params"])
            seen[trainer.global_step - 1][0] = float(optimizer.state[z]["step"])  # Adam's own step count

    args = fit_args(
        tmp_path, steps=4, extra=["--model.init_args.finetune_fraction=0.5", "--model.init_args.finetune_lr_ratio=0.25"]
    )
    cli = build_cli(args[1:], run=False)
    cli.trainer.callbacks.append(Spy())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.model.finetune_start() == 2 and cli.trainer.global_step == 4
    assert [seen[s][0] for s in range(4)] == [1.0, 2.0, 1.0, 2.0]  # Adam restarted at the switch
    lr_z = cli.model.lr_z
    assert seen[2][1] == pytest.approx(0.25 * lr_z)  # the tail's cosine starts at finetune_lr_ratio
    assert seen[3][1] < seen[2][1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(cli.trainer.log_dir)).Reload()
    assert [e.step for e in events.Scalars("train/loss_layer_00")] == [0, 1, 2, 3]  # measured in the tail too
    layer_tags = [tag for tag in events.Tags()["scalars"] if tag.startswith("train/loss_layer_")]
    per_layer = {e.step: [] for e in events.Scalars("train/loss")}
    for tag in layer_tags:
        for e in events.Scalars(tag):
            per_layer[e.step].append(e.value)
    for e in events.Scalars("train/loss"):  # the mean of that step's layer losses, not the last stage-1 value
        assert e.value == pytest.approx(sum(per_layer[e.step]) / len(per_layer[e.step]), rel=1e-5), e.step
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2, 3]
    assert [e.step for e in events.Scalars("train/logit_kd")] == [2, 3]
    assert all(math.isfinite(e.value) and e.value > 0 for e in events.Scalars("train/logit_kd"))
    with pytest.raises(ValueError, match="finetune_fraction"):
        build_cli(fit_args(tmp_path / "bad", steps=1, extra=["--model.init_args.finetune_fraction=1.5"]))


class _Killed(Exception):
    pass


def test_killed_run_resumes_from_last_with_same_steps(tmp_path):
    """Kill at step 5 (last checkpoint: step 4), resume with ``--ckpt_path last``: 8 optimizer steps in all
    and bit for bit the feature maps of an uninterrupted run (data skip + step-seeded row sampling + Adam
    state): on one CPU a fit with the same seed repeats exactly, killed or not."""
    import lightning as L

    class KillAt(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 5:
                raise _Killed

    def checkpoints(name):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"trainer": {"callbacks": [{
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(tmp_path / name / "ckpt"), "save_last": True, "every_n_train_steps": 2,
                          "save_top_k": 0}}]}}))  # fmt: skip  # packed args
        return ["--config", str(path)]

    reference = build_cli(fit_args(tmp_path / "ref", steps=8, extra=checkpoints("ref")))
    args = fit_args(tmp_path / "run", steps=8, extra=checkpoints("run"))
    cli = build_cli(args[1:], run=False)  # no subcommand: we call fit ourselves to inject the kill
    cli.trainer.callbacks.append(KillAt())
    with pytest.raises(_Killed):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    last = tmp_path / "run" / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 4
    resumed = build_cli(args + ["--ckpt_path=last"])
    assert resumed.trainer.global_step == reference.trainer.global_step == 8
    a = load_student(Path(reference.trainer.log_dir) / "student").state_dict()
    b = load_student(Path(resumed.trainer.log_dir) / "student").state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), (key, (a[key].double() - b[key].double()).abs().max())


def test_capture_phase_feeds_a_fit(tmp_path):
    """``predict`` with the capture config writes q/k samples and dof.json; a fit can reuse that report."""
    from tests.conftest import TINYSTORIES, WIKIPEDIA

    build_cli(["predict", "--config", str(REPO / "configs/capture.yaml"), f"--model.init_args.teacher={TINYSTORIES}",
               f"--data.init_args.path={WIKIPEDIA}", "--data.init_args.seq_len=64", "--data.init_args.predict_blocks=4",
               "--model.init_args.num_samples=64", f"--model.init_args.output_dir={tmp_path / 'cap'}",
               "--trainer.enable_progress_bar=false",
               f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip  # packed args
    samples = torch.load(tmp_path / "cap" / "qk_samples.pt")
    assert sorted(samples) == [0, 1] and samples[0].shape == (8, 64, 16)
    report = json.loads((tmp_path / "cap" / "dof.json").read_text())
    assert report["tokens"] == 4 * 64 and len(report["head_dof"][0]) == 8
    cli, log_dir = _run(tmp_path / "fit", steps=1, extra=[f"{PLANNER}.report_path={tmp_path / 'cap' / 'dof.json'}"])
    assert cli.model.plan.feature_dims == [max(8, m) for m in report["allocations"]["dof"]]
    assert json.loads((log_dir / "dof.json").read_text()) == report  # the report it read, in the run's own folder


def test_layerwise_teacher_pass_stops_early_and_can_serve_several_steps(tmp_path, monkeypatch):
    """The layer-wise capture without logits stops after the last twin's layer and captures exactly what the
    full forward does; ``teacher_reuse=2`` runs the teacher on steps 0 and 2 only, for the same losses a
    capture of those batches gives."""
    from lit_dof.pipeline.layerwise import LayerwiseDistillation

    extra = ["--model.init_args.teacher_reuse=2", "--model.init_args.finetune_fraction=0"]
    cli = build_cli(fit_args(tmp_path, steps=4, extra=extra)[1:], run=False)
    calls = []
    original = LayerwiseDistillation._teacher_forward

    def spy(self, batch, *, capture, logits=True, positions=None):
        calls.append((self.global_step, logits))
        logits_out, captured = original(self, batch, capture=capture, logits=logits, positions=positions)
        if capture and not logits:  # the early-stopped capture equals the full forward's
            assert logits_out is None
            _, full = original(self, batch, capture=True, logits=True, positions=positions)
            assert full.keys() == captured.keys()
            for index in full:
                for a, b in zip(vars(full[index]).values(), vars(captured[index]).values()):
                    if isinstance(a, tuple):  # the rotary (cos, sin)
                        assert isinstance(b, tuple) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
                    else:
                        assert (a is None and b is None) or torch.equal(a, b)
        return logits_out, captured

    monkeypatch.setattr(LayerwiseDistillation, "_teacher_forward", spy)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 4
    assert [step for step, logits in calls if not logits] == [0, 2]
    with pytest.raises(ValueError, match="teacher_reuse"):
        build_cli(fit_args(tmp_path / "bad", steps=1, extra=["--model.init_args.teacher_reuse=0"]))
    # under gradient accumulation every micro-batch gets its own teacher pass (teacher_reuse counts batches)
    calls.clear()
    extra = ["--trainer.accumulate_grad_batches=2", "--model.init_args.finetune_fraction=0"]
    cli = build_cli(fit_args(tmp_path / "acc", steps=2, extra=extra)[1:], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert [step for step, logits in calls if not logits] == [0, 0, 1, 1]


@pytest.mark.parametrize("config", ["methods/dof.yaml", "methods/swa_sink_linear.yaml"])
def test_per_layer_backward_gives_the_summed_loss_gradients(tmp_path, monkeypatch, config):
    """``layer_backward`` (the default) differentiates each layer's loss on its own and frees its capture; the
    gradients Lightning's backward leaves in ``p.grad`` equal one backward of the summed loss, on a twin with
    a learned far-term weight too, and the capture is emptied as it goes."""
    from lit_dof.pipeline.layerwise import LayerwiseDistillation

    grads, left = {}, []
    original = LayerwiseDistillation._layerwise_backward

    def spy(self, captured, batch_idx, release):
        result = original(self, captured, batch_idx, release)
        left.append(len(captured))
        return result

    def record(self, optimizer):
        grads[self.layer_backward] = {n: p.grad.clone() for n, p in self.trainable_parameters() if p.grad is not None}

    monkeypatch.setattr(LayerwiseDistillation, "_layerwise_backward", spy)
    monkeypatch.setattr(LayerwiseDistillation, "on_before_optimizer_step", record)
    for each in (True, False):
        extra = [
            f"--model.init_args.layer_backward={str(each).lower()}",
            "--model.init_args.finetune_fraction=0",
            "--model.init_args.sliding_window.window=8",
            "--trainer.limit_val_batches=0",
        ]
        cli = build_cli(fit_args(tmp_path / str(each), config, steps=1, extra=extra)[1:], run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert left == [0]  # one per-layer step, its capture released layer by layer
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) >= 2
    for name, grad in grads[False].items():
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-5, atol=1e-8)


def test_far_pair_dof_for_a_sliding_window_student(tmp_path):
    """The planner's ``far_pairs`` pools only vectors of pairs beyond the window: another DoF than the plain pool on
    the same batches; refused without a window."""
    window = ["--model.init_args.sliding_window.window=16"]
    _, far_dir = _run(
        tmp_path / "far", "methods/swa_linear.yaml", steps=1, extra=[*window, f"{PLANNER}.far_pairs=true"]
    )
    _, plain_dir = _run(tmp_path / "plain", "methods/swa_linear.yaml", steps=1, extra=window)
    far, plain = (json.loads((d / "dof.json").read_text()) for d in (far_dir, plain_dir))
    assert far["tokens"] == plain["tokens"] and far["head_dof"] != plain["head_dof"]
    with pytest.raises(ValueError, match="far_pairs needs a sliding-window student"):
        _run(tmp_path / "bad", steps=1, extra=[f"{PLANNER}.far_pairs=true"])
