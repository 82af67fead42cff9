"""A run that fails before it trains leaves no empty version directory behind: :class:`FailedRunCleanup`, an
always-present callback of the lit-dof Lightning commands (the ``failed_run_cleanup:`` group).

Lightning creates ``<save_dir>/<name>/version_N/`` and a TensorBoard events file in it before any callback hook runs
(``Trainer._call_setup_hook`` touches ``logger.experiment`` first), so a fit whose teacher cannot be loaded, or whose
settings ``configure_model`` refuses, used to leave a version holding an empty events file (and ``config.yaml``),
which the next run's version number then skips. On such a failure (Lightning's ``on_exception`` hook, rank 0) this
callback removes the files this run created there when they are all that the directory holds, and then the
directory. It keeps everything when the run did any training step, and whenever the directory holds anything else:
a checkpoint, an exported student, ``metrics.jsonl``, ``dof.json`` and figures, another process's events file — the
version directory of a resumed run (``--ckpt_path last``) always holds its checkpoints.

"Created by this run" is decided without patching the logger: an events file whose name carries this host, this
process's pid and a time no earlier than the callback's construction (TensorBoard names them
``events.out.tfevents.<time>.<host>.<pid>.<n>``), and the bookkeeping files :data:`BOOKKEEPING` when they were
absent at this callback's ``setup``. A directory that held nothing but such files is removed even if it existed,
empty, before the run (nothing tells an empty folder's age); one holding anything else never is.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info

BOOKKEEPING = ("config.yaml", "hparams.yaml")
"""Files Lightning writes into a version directory before training (LightningCLI's saved config, a logger's
hyperparameters): removable when this run created them."""


def own_events_file(name: str, since: float) -> bool:
    """Whether ``name`` is a TensorBoard events file this process created at ``since`` or later.

    Args:
        name: a file name.
        since: Unix seconds.

    Returns:
        True for ``events.out.tfevents.<time>.<host>.<pid>.<n>[suffix]`` with this host's name, this process's pid
        and ``time >= int(since)`` (the name's time is whole seconds).
    """
    host, pid = re.escape(socket.gethostname()), os.getpid()
    match = re.match(rf"events\.out\.tfevents\.(\d+)\.{host}\.{pid}\.\d+", name)
    return bool(match) and int(match.group(1)) >= int(since)


class FailedRunCleanup(L.Callback):
    """Remove the version directory of a run that failed before training when it holds only what this run created.

    Exactly what is removed and what is kept: the module's docstring.

    Args:
        enabled: False leaves whatever a failed run created.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._created_at = time.time()  # before the trainer exists: the logger writes nothing earlier
        self._present_at_setup: dict[str, set[str]] = {}
        self._trained = False

    @staticmethod
    def _version_loggers(trainer: L.Trainer) -> list[TensorBoardLogger | CSVLogger]:
        """The trainer's loggers with a ``version_N`` directory of their own (``log_dir``: no collective)."""
        return [logger for logger in trainer.loggers if isinstance(logger, (TensorBoardLogger, CSVLogger))]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Note what each version directory holds before the other callbacks write into it (LightningCLI's
        ``config.yaml`` comes after this, its callback being the last)."""
        self._trained = False
        self._present_at_setup = {}
        if self.enabled and trainer.is_global_zero:
            for logger in self._version_loggers(trainer):
                log_dir = logger.log_dir
                self._present_at_setup[log_dir] = set(os.listdir(log_dir)) if os.path.isdir(log_dir) else set()

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        """Mark the run as trained: from now on a failure keeps everything."""
        self._trained = True

    def _created_files(self, log_dir: str) -> list[Path] | None:
        """The files of ``log_dir`` this run created, or None when it holds anything else."""
        present = self._present_at_setup.get(log_dir)  # None: setup never ran
        created = []
        for entry in os.scandir(log_dir):
            new_bookkeeping = entry.name in BOOKKEEPING and present is not None and entry.name not in present
            if not entry.is_file(follow_symlinks=False):
                return None
            if not (own_events_file(entry.name, self._created_at) or new_bookkeeping):
                return None
            created.append(Path(entry.path))
        return created

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """On rank 0, when no training step ran: remove each version directory holding nothing but files this run
        created (the loggers are finalized first, so that none writes there afterwards)."""
        if not self.enabled or self._trained or not trainer.is_global_zero:
            return
        for logger in self._version_loggers(trainer):
            log_dir = logger.log_dir
            created = self._created_files(log_dir) if os.path.isdir(log_dir) else None
            if created is None:
                continue
            logger.finalize("failed")  # flush and close the events file (Lightning's own finalize then does nothing)
            for path in created:
                path.unlink(missing_ok=True)
            try:
                os.rmdir(log_dir)  # refuses if anything appeared meanwhile
            except OSError:
                continue
            rank_zero_info(f"Removed {log_dir}: the run failed before training and left nothing else there.")
