"""What a fit leaves in its own log directory whatever logger is configured: ``metrics.jsonl`` (every logged metric,
one JSON line per logging call) and the run's figures as PNG files (also sent to the logger), plus the batch
measures that Lightning's :class:`~lightning.pytorch.callbacks.ThroughputMonitor` needs for lit-dof batches.

* :class:`MetricsFile` — an always-present callback of ``lit-dof fit`` (the ``metrics_file:`` group) that adds a
  :class:`JsonlMetricsLogger` beside the configured logger(s): TensorBoard, CSV, W&B or any other, unchanged.
  ``lit-dof compare`` reads ``metrics.jsonl`` (:func:`read_metrics`); a resumed run appends to the same file after
  dropping the lines it is about to log again (:func:`drop_metrics_from`), so each step's metrics appear once.
* :func:`log_figure` — a figure as ``<log_dir>/figures/<tag>.png``, to TensorBoard (``add_figure``) and to loggers
  with a ``log_image`` method (W&B) as an RGBA image.
* :func:`batch_rows` / :func:`batch_tokens` — ``batch_size_fn`` / ``length_fn`` of the ``ThroughputMonitor`` in the
  shipped configs (``train/device/items_per_sec``: tokens per second; ``train/lengths``: tokens read).
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_dof.io import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
"""The metrics file's name in a run's log directory."""


def _input_ids(batch: Any) -> torch.Tensor:
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else batch
    if not isinstance(ids, torch.Tensor) or ids.dim() < 1:
        raise TypeError(f"expected a batch dict with a (B, T) 'input_ids' tensor, got {type(batch).__name__}")
    return ids


def batch_rows(batch: Any) -> int:
    """Sequences in a batch (``ThroughputMonitor``'s ``batch_size_fn``).

    Args:
        batch: a dict with ``input_ids`` ``(B, T)`` (or ``(B, choices, T)``), or that tensor itself.

    Returns:
        B.

    Raises:
        TypeError: no ``input_ids`` tensor.
    """
    return int(_input_ids(batch).shape[0])


def batch_tokens(batch: Any) -> int:
    """Tokens in a batch (``ThroughputMonitor``'s ``length_fn``): the ones its ``attention_mask`` keeps, else every
    position of ``input_ids``.

    Args:
        batch: as for :func:`batch_rows`.

    Returns:
        the number of tokens.

    Raises:
        TypeError: no ``input_ids`` tensor.
    """
    ids = _input_ids(batch)
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    return int(mask.sum()) if isinstance(mask, torch.Tensor) else ids.numel()


def run_log_dir(trainer: L.Trainer) -> str:
    """The run's own directory: ``trainer.log_dir`` for TensorBoard and CSV loggers (``<save_dir>/<name>/version_N``),
    ``<save_dir>/<name>/<version>`` for other loggers (where Lightning's ``ModelCheckpoint`` puts their checkpoints,
    e.g. W&B's ``<save_dir>/<project>/<run id>``), the trainer's ``default_root_dir`` without a logger.

    A collective under DDP (``trainer.log_dir`` broadcasts): call it on every rank.

    Args:
        trainer: the trainer.

    Returns:
        the directory (not created).
    """
    log_dir = trainer.log_dir  # every rank: Lightning broadcasts it
    logger = next((lg for lg in trainer.loggers if not isinstance(lg, JsonlMetricsLogger)), None)
    if logger is None or isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return log_dir or trainer.default_root_dir
    version = logger.version if trainer.is_global_zero else None
    version = trainer.strategy.broadcast(version)
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


class JsonlMetricsLogger(Logger):
    """A Lightning logger that appends each ``log_metrics`` call to a JSON-lines file: ``{"step", "time", name:
    value, …}`` (``time``: Unix seconds). Each line goes out in one ``write`` on a file opened for appending, so a
    killed run leaves at most one partial last line, which :func:`read_metrics` skips; a resumed run appends.

    Args:
        path: the file (its folder is created).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(path)

    @property
    def name(self) -> str:
        """``"metrics_file"``."""
        return "metrics_file"

    @property
    def version(self) -> str:
        """The file's name."""
        return self.path.name

    @property
    def save_dir(self) -> str:
        """The file's folder."""
        return str(self.path.parent)

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """Nothing: the run's ``config.yaml`` holds them."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Append one line with ``metrics`` (tensors as numbers; non-finite values as ``null``).

        Args:
            metrics: name → number or one-element tensor.
            step: the step Lightning logs them at.
        """
        record: dict[str, Any] = {"step": step, "time": round(time.time(), 3)}
        for key, value in metrics.items():
            value = value.item() if isinstance(value, torch.Tensor) else value
            record[key] = value if not isinstance(value, float) or math.isfinite(value) else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_metrics(path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a :class:`JsonlMetricsLogger` file as ``(step, value)`` points sorted by step; a step logged
    twice (a resumed run re-doing the steps after its checkpoint) keeps its later value; an unreadable line (a run
    killed while writing) is skipped.

    Args:
        path: a ``metrics.jsonl`` file.

    Returns:
        metric name → points (``step`` and ``time`` are not metrics).
    """
    points: dict[str, dict[int, float]] = {}
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = record.get("step")
        for key, value in record.items():
            if key not in ("step", "time") and step is not None and value is not None:
                points.setdefault(key, {})[int(step)] = float(value)
    return {key: sorted(values.items()) for key, values in points.items()}


def _line_step(line: bytes) -> tuple[bool, int | None]:
    """(whether a metrics line is readable JSON, its integer ``step`` or None)."""
    try:
        record = json.loads(line)
    except ValueError:
        return False, None
    step = record.get("step") if isinstance(record, dict) else None
    return True, step if isinstance(step, int) and not isinstance(step, bool) else None


def drop_metrics_from(path: str | os.PathLike, step: int) -> int:
    """Rewrite a :class:`JsonlMetricsLogger` file (atomically) without its lines logged at ``step`` or later: what a
    run resumed from a checkpoint of that step logs again. A partial last line (a run killed while writing) goes
    too; every other line, unreadable ones and lines without a step included, stays as it was.

    Args:
        path: a ``metrics.jsonl`` file (a missing one is left missing).
        step: the step of the resumed run's first logged metrics (a checkpoint's step).

    Returns:
        the number of lines removed (0: the file was not rewritten).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    *lines, tail = data.split(b"\n")  # tail: b"" after a complete last line, else what a killed write left
    kept = []
    for line in lines:
        logged_at = _line_step(line)[1]
        if logged_at is None or logged_at < step:
            kept.append(line)
    readable, logged_at = _line_step(tail) if tail else (False, None)
    if readable and (logged_at is None or logged_at < step):  # a whole record without its newline
        kept.append(tail)
    removed = len(lines) + bool(tail) - len(kept)
    if removed:
        atomic_write_bytes(path, b"".join(line + b"\n" for line in kept))
    return removed


class MetricsFile(L.Callback):
    """Write every metric the run logs to ``<log_dir>/metrics.jsonl`` beside the configured logger(s).

    At setup it adds a :class:`JsonlMetricsLogger` to the trainer's loggers (after them: ``trainer.logger`` and the
    log directory stay the configured logger's). Without any logger (``logger: false``) nothing is written. A fit
    resumed from a checkpoint first drops the file's lines from the checkpoint's step on (:func:`drop_metrics_from`,
    rank 0): the resumed run logs those steps again, so each ``(step, metric)`` keeps one value, the resumed run's.

    Args:
        enabled: False writes no metrics file.
        filename: the file's name in the run's log directory (run_log_dir).
    """

    def __init__(self, enabled: bool = True, filename: str = METRICS_FILE) -> None:
        self.enabled, self.filename = enabled, filename
        self.path: Path | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Attach the metrics logger (once), on every rank (it writes on rank 0 only)."""
        if not self.enabled or not trainer.loggers:
            return
        if any(isinstance(logger, JsonlMetricsLogger) for logger in trainer.loggers):
            return
        self.path = Path(run_log_dir(trainer)) / self.filename
        trainer.loggers = [*trainer.loggers, JsonlMetricsLogger(self.path)]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """On rank 0, drop the metrics the resumed run will log again (:func:`drop_metrics_from`): those logged at
        the checkpoint's ``global_step`` or later. Metrics are logged at Lightning's count of batches that stepped an
        optimizer, which a resumed fit continues from that ``global_step`` (with one optimizer; with several,
        ``global_step`` is larger and some lines stay twice rather than any being lost)."""
        path = next((logger.path for logger in trainer.loggers if isinstance(logger, JsonlMetricsLogger)), None)
        if self.enabled and path is not None and trainer.is_global_zero:
            drop_metrics_from(path, int(checkpoint["global_step"]))


def figure_png(figure: Figure, dpi: int = 100) -> bytes:
    """A matplotlib figure as PNG bytes (rendered on its own canvas; no pyplot)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def log_figure(loggers: list[Logger], log_dir: str | os.PathLike, tag: str, figure: Figure, step: int = 0) -> Path:
    """Save ``figure`` as ``<log_dir>/figures/<tag>.png`` (``/`` in the tag becomes ``_``) and send it to every logger
    that takes images: TensorBoard's ``add_figure``, else a logger's ``log_image`` (W&B and the like) as an
    ``(H, W, 4)`` uint8 RGBA array. Call on rank 0 only.

    Args:
        loggers: the trainer's loggers.
        log_dir: the run's log directory (:func:`run_log_dir`).
        tag: the figure's name, e.g. ``"dof/heads"``.
        figure: a matplotlib figure with an Agg canvas.
        step: the step to log it at.

    Returns:
        the PNG's path.
    """
    path = Path(log_dir) / "figures" / f"{tag.replace('/', '_')}.png"
    atomic_write_bytes(path, figure_png(figure))
    for logger in loggers:
        if callable(getattr(logger, "log_image", None)):
            figure.canvas.draw()
            image = torch.frombuffer(bytearray(figure.canvas.buffer_rgba()), dtype=torch.uint8)
            height, width = figure.canvas.get_width_height()[::-1]
            logger.log_image(key=tag, images=[image.view(height, width, 4).numpy()], step=step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure(tag, figure, global_step=step, close=False)
    return path


def log_text(loggers: list[Logger], log_dir: str | os.PathLike, tag: str, text: str, step: int = 0) -> Path:
    """Save markdown ``text`` as ``<log_dir>/figures/<tag>.md`` and add it to TensorBoard loggers (``add_text``).

    Args:
        loggers: the trainer's loggers.
        log_dir: the run's log directory.
        tag: its name, e.g. ``"dof/table"``.
        text: markdown.
        step: the step to log it at.

    Returns:
        the file's path.
    """
    path = Path(log_dir) / "figures" / f"{tag.replace('/', '_')}.md"
    atomic_write_text(path, text + "\n")
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(tag, text, global_step=step)
    return path
