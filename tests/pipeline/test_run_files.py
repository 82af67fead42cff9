"""What a fit leaves in its own log directory whatever the logger: metrics.jsonl, the DoF figures as PNG files,
``train/tokens`` as a running total and Lightning's ThroughputMonitor (tokens/s)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.logger import Logger

from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.run_files import (
    METRICS_FILE,
    JsonlMetricsLogger,
    batch_rows,
    batch_tokens,
    log_figure,
    read_metrics,
)
from tests.conftest import REPO
from tests.pipeline.conftest import fit_args

BATCH, SEQ = 2, 64  # tests.pipeline.conftest.TINY_ARGS
PNG = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR width, height


def test_a_csv_logger_run_gets_the_figures_the_metrics_file_and_tokens_per_second(tmp_path):
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}}
    steps = 10  # the quickstart's ThroughputMonitor averages rates over 10 steps
    cli = build_cli(fit_args(tmp_path, steps=steps, extra=[f"--trainer.logger={json.dumps(logger)}"]))
    run = Path(cli.trainer.log_dir)
    assert run == tmp_path / "lit-dof" / "version_0" and not list(run.glob("events.out.tfevents.*"))
    assert _png_size(run / "figures" / "dof_heads.png")[0] == 600  # 6 in × 100 dpi
    assert _png_size(run / "figures" / "dof_feature_dims.png") == (700, 300)
    assert (run / "figures" / "dof_table.md").read_text().startswith("| layer | DoF | M |")

    metrics = read_metrics(run / METRICS_FILE)
    expected = [(s, float(BATCH * SEQ * (s + 1))) for s in range(steps)]  # B × T × steps so far (tail included)
    assert metrics["train/tokens"] == expected  # the teacher's tokens: a running total
    assert metrics["train/lengths"] == expected  # ThroughputMonitor's tokens read (batch_tokens)
    assert metrics["train/samples"] == [(s, float(BATCH * (s + 1))) for s in range(steps)]
    (last, rate), *_ = metrics["train/device/items_per_sec"]
    assert last == steps - 1 and rate > 0  # tokens per second over the last 10 steps
    # the same numbers as the user's own logger wrote
    with open(run / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["val/ppl_student"]]
    assert [(int(r["step"]), float(r["val/ppl_student"])) for r in rows] == metrics["val/ppl_student"]


def test_tokens_count_fresh_teacher_passes_across_a_resume_and_compare_reads_them_from_either_file(tmp_path):
    """``teacher_reuse=2``: every other batch reuses the previous capture and adds no tokens; a resumed run
    captures afresh at its first batch and continues the checkpointed total."""
    from lit_dof.comparison.artefacts import run_metric, validation_curve

    cell = tmp_path / "cell"
    reuse = ["--model.init_args.teacher_reuse=2", "--model.init_args.finetune_fraction=0"]  # layer-wise only
    build_cli(fit_args(cell / "runs", steps=2, extra=reuse))
    build_cli(fit_args(cell / "runs", steps=4, extra=[*reuse, "--ckpt_path=last"]))
    run = cell / "runs" / "lit-dof" / "version_0"
    metrics = read_metrics(run / METRICS_FILE)
    assert metrics["train/tokens"] == [(s, float(BATCH * SEQ * (s // 2 + 1))) for s in range(4)]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["lit_dof_tokens_seen"] == 2 * BATCH * SEQ

    from_file = validation_curve(cell)
    assert [step for step, _ in from_file] == [1, 3]  # one validation per run
    (run / METRICS_FILE).rename(run / "elsewhere.jsonl")  # a run from before metrics.jsonl: TensorBoard
    from_events = validation_curve(cell)
    assert [s for s, _ in from_events] == [1, 3]
    assert [v for _, v in from_events] == pytest.approx([v for _, v in from_file], rel=1e-6)  # TB keeps float32
    assert run_metric(run, "train/tokens") == pytest.approx(dict(metrics["train/tokens"]))
    assert run_metric(tmp_path, "val/ppl_student") == {}  # neither file


class _ImageLogger(Logger):
    """A logger with W&B's ``log_image(key, images, step)``, recording what it gets."""

    def __init__(self):
        super().__init__()
        self.images = []

    name, version = "images", 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_image(self, key, images, step=None):
        self.images.append((key, images, step))


def test_figures_go_to_image_loggers_to_tensorboard_and_always_to_png(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lit_dof.pipeline.callbacks import _figure

    fig, ax = _figure((3, 2))
    ax.plot([0, 1], [1, 0])
    images, board = _ImageLogger(), TensorBoardLogger(str(tmp_path), name="tb", version=0)
    path = log_figure([images, board, JsonlMetricsLogger(tmp_path / "m.jsonl")], tmp_path, "dof/heads", fig, step=3)
    assert path == tmp_path / "figures" / "dof_heads.png" and _png_size(path) == (300, 200)
    ((key, [image], step),) = images.images
    assert (key, step, image.shape, str(image.dtype)) == ("dof/heads", 3, (200, 300, 4), "uint8")
    assert image[..., 3].min() == 255 and image[..., :3].min() < 255  # opaque, and something drawn
    board.experiment.flush()
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"images": 0}).Reload()
    assert [e.step for e in events.Images("dof/heads")] == [3]


def test_the_metrics_file_skips_a_partial_line_and_keeps_the_later_value_of_a_step(tmp_path):
    logger = JsonlMetricsLogger(tmp_path / "run" / METRICS_FILE)
    logger.log_metrics({"a": torch.tensor(1.5), "b": float("nan")}, step=0)
    logger.log_metrics({"a": 2.0}, step=1)
    logger.log_metrics({"a": 3.0}, step=1)  # a resumed run re-doing step 1
    with open(logger.path, "a") as f:
        f.write('{"step": 2, "a": 4')  # killed while writing
    assert read_metrics(logger.path) == {"a": [(0, 1.5), (1, 3.0)]}
    assert json.loads(logger.path.read_text().splitlines()[0])["b"] is None


def test_batch_measures_of_the_throughput_monitor():
    ids = torch.zeros(3, 5, dtype=torch.long)
    assert (batch_rows({"input_ids": ids}), batch_tokens({"input_ids": ids})) == (3, 15)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    assert batch_tokens({"input_ids": ids, "attention_mask": mask}) == 12
    with pytest.raises(TypeError, match="input_ids"):
        batch_tokens({"labels": ids})


def test_wandb_example_config_names_lightnings_wandb_logger():
    import importlib

    config = yaml.safe_load((REPO / "configs" / "trainer" / "wandb.yaml").read_text())
    module, _, name = config["trainer"]["logger"]["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Logger) and cls.__name__ == "WandbLogger" and module.startswith("lightning.pytorch")
    assert set(config["trainer"]["logger"]["init_args"]) <= set(cls.__init__.__code__.co_varnames)


def test_every_shipped_trainer_config_monitors_throughput_in_tokens():
    for path in [REPO / "configs" / "quickstart.yaml", *sorted((REPO / "configs" / "trainer").glob("*.yaml"))]:
        if path.name == "wandb.yaml":  # a logger swap, composed after a trainer file
            continue
        callbacks = yaml.safe_load(path.read_text())["trainer"]["callbacks"]
        monitor = [c for c in callbacks if c["class_path"].endswith("ThroughputMonitor")]
        assert monitor and monitor[0]["init_args"]["length_fn"] == "lit_dof.pipeline.run_files.batch_tokens", path
