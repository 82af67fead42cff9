"""What ``lit-dof fit`` prints on the console: its progress bar, and where its outputs go.

* :class:`StepProgressBar` — for a fit limited by ``trainer.max_steps`` (every shipped config), one bar over the
  optimizer steps of the whole run, right after a resume too::

      step 80/640 [05:12<36:24, tok/s=1.05k, loss=0.412, val/ppl_student=41.2]

  (elapsed < estimated time left, tokens read per second, the metrics logged with ``prog_bar=True`` without
  their ``train/`` prefix), instead of Lightning's per-epoch bar, which counts the batches of an "epoch" of an
  endless stream (``Epoch 0/-2``, ``8/2`` after a resume) and shows the first logger's version as ``v_num``.
  Fits limited by epochs keep Lightning's bar, without ``v_num``.
* :class:`RunPaths` — prints the run directory when the fit starts, and the run directory and the exported
  student's folder when it ends.

Both are added to the trainer by ``lit-dof``'s LightningCLI (:class:`~lit_dof.pipeline.cli.LitDofCLI`), the bar
unless the progress bar is disabled or the trainer's callbacks hold another one.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from lit_dof.pipeline.run_files import batch_tokens, run_log_dir

BAR_FORMAT = "step {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
"""The step bar's layout (tqdm's fields; ``{postfix}`` starts with ``, ``)."""


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar, over the optimizer steps of a step-limited fit (see the module docstring).

    Args:
        refresh_rate: update the bar every this many steps (batches, for the other bars); 0 disables it.
        process_position: lines to leave above the bars (other progress bars).
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position)
        self._tokens = 0
        self._started: float | None = None

    def _by_steps(self) -> bool:
        trainer = self.trainer
        return trainer.max_steps is not None and trainer.max_steps > 0

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """The progress-bar metrics without ``v_num`` and without the ``train/`` prefix; for a step-limited fit,
        ``tok/s`` first: the tokens of the batches read since the bar started (this rank's × the world size) per
        second.

        Returns:
            ``{name: value}`` in display order.
        """
        metrics = {
            key.removeprefix("train/"): value
            for key, value in super().get_metrics(trainer, pl_module).items()
            if key != "v_num"
        }
        if self._by_steps() and self._started is not None and self._tokens:
            seconds = max(time.monotonic() - self._started, 1e-9)
            metrics = {
                "tok/s": Tqdm.format_sizeof(self._tokens * trainer.world_size / seconds, divisor=1000),
                **metrics,
            }
        return metrics

    def init_train_tqdm(self) -> Tqdm:
        """The training bar: for a step-limited fit, over ``max_steps`` from the trainer's ``global_step`` (a
        resumed run's), its rate and time left measured on the steps of this run; else Lightning's."""
        if not self._by_steps():
            return super().init_train_tqdm()
        self._tokens, self._started = 0, None
        trainer = self.trainer
        return Tqdm(
            total=trainer.max_steps,
            initial=trainer.global_step,
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=BAR_FORMAT,
        )

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        """Lightning's per-epoch reset, except for a step-limited fit, whose bar spans the run."""
        if not self._by_steps():
            super().on_train_epoch_start(trainer, *args)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Start the tokens-per-second clock at the first batch (setup and the teacher's load are not counted)."""
        if self._started is None:
            self._started = time.monotonic()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the batch's tokens and move a step-limited bar to ``global_step``."""
        if not self._by_steps():
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        try:
            self._tokens += batch_tokens(batch)
        except TypeError:  # not a lit-dof batch: no tokens/s
            pass
        bar = self.train_progress_bar
        step = trainer.global_step
        if not bar.disable and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning's, except that a step-limited bar stays open until the fit ends."""
        if not self._by_steps():
            super().on_train_epoch_end(trainer, pl_module)
        elif not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


class RunPaths(L.Callback):
    """Print, on rank 0, ``run directory: DIR`` when a fit starts, and ``run directory: DIR`` and
    ``student: FOLDER`` when it has ended and exported the student."""

    def __init__(self) -> None:
        self.log_dir: str | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Print the run directory (:func:`~lit_dof.pipeline.run_files.run_log_dir`, asked on every rank)."""
        if stage != "fit":
            return
        self.log_dir = run_log_dir(trainer)
        if trainer.is_global_zero:
            print(f"run directory: {self.log_dir}", flush=True)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """After a fit that ended normally (the module's ``on_fit_end`` has exported the student), print the run
        directory and the student's folder (or that none was exported)."""
        if stage != "fit" or self.log_dir is None or not trainer.is_global_zero:
            return
        print(f"run directory: {self.log_dir}", flush=True)
        if hasattr(pl_module, "export_dir"):
            exported = getattr(pl_module, "exported_to", None)
            print(f"student: {exported or 'not exported (--model.init_args.export_dir is empty)'}", flush=True)
