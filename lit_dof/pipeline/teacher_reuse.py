"""``teacher_reuse``: one layer-wise teacher pass serves k consecutive training batches, and a resumed run reuses
exactly the pass the interrupted one would have.

A run with ``teacher_reuse`` k captures the teacher's attention at layer-wise batches 0, k, 2k, … (micro-batches
under gradient accumulation) and keeps that capture for the k − 1 batches after it (whose own data is skipped).
:class:`ReusedCapture` counts the batches and remembers where the kept capture came from: the data index of its
batch (the training stream is deterministic by index: :meth:`~lit_dof.data.datamodule.WikipediaDataModule.train_batch`)
and the ``(global_step, batch_idx)`` that seeded its position offsets. Both go into every checkpoint
(:meth:`ReusedCapture.state_dict`), so a run resumed from a checkpoint inside a group re-creates the kept capture
from the same batch with the same positions — bit for bit the uninterrupted run — instead of capturing the
resumed step's own batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn


@dataclass
class ReusedCapture:
    """Which layer-wise batch captures afresh, the capture kept for the others, and what re-creates it.

    Attributes:
        every: ``teacher_reuse`` k ≥ 1 (1: every batch captures, nothing is kept).
        batches: layer-wise batches trained so far, across resumes (the next batch's data index: the layer-wise
            phase comes first, and the training stream resumes at ``global_step × accumulate_grad_batches``).
        fresh_at: ``(global_step, batch_idx)`` of the batch the kept capture came from (they seed its positions);
            ``None`` before the first capture.
        capture: the kept capture ``{layer: CapturedAttention}``; not checkpointed (re-created after a resume).
    """

    every: int = 1
    batches: int = 0
    fresh_at: tuple[int, int] | None = None
    capture: dict | None = field(default=None, repr=False)

    def due(self) -> bool:
        """Whether the next batch starts a group (captures afresh)."""
        return self.batches % self.every == 0

    def group_start(self) -> int:
        """The data index of the batch the current group's capture came from."""
        return self.batches - self.batches % self.every

    def needs_recapture(self) -> bool:
        """Whether the next batch falls inside a group whose capture is not held (a run resumed mid-group)."""
        return not self.due() and self.capture is None and self.fresh_at is not None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: ``{"every", "batches", "fresh_at"}`` (plain ints: loads with ``weights_only``)."""
        return {"every": self.every, "batches": self.batches, "fresh_at": list(self.fresh_at or ()) or None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counts (the capture itself is re-created at the next batch).

        Args:
            state: a checkpoint's ``lit_dof_teacher_reuse``.

        Raises:
            ValueError: the checkpoint was written with another ``teacher_reuse``.
        """
        if int(state["every"]) != self.every:
            raise ValueError(
                f"the checkpoint was trained with teacher_reuse={state['every']}, this run has {self.every}: resume "
                f"with --model.init_args.teacher_reuse={state['every']}"
            )
        self.batches = int(state["batches"])
        self.fresh_at = tuple(state["fresh_at"]) if state.get("fresh_at") else None
        self.capture = None


def kept_batch(trainer: Any, index: int) -> dict | None:
    """The training batch at data index ``index`` on this rank, on the module's device, read again from the data
    module (its ``train_batch(index)``), for re-creating a kept capture after a resume.

    Args:
        trainer: the running trainer (its ``datamodule`` and ``strategy``).
        index: the batch's data index (batches of this rank since step 0).

    Returns:
        the batch, or ``None`` (with a warning: the resumed run then captures its own batch, and is not bit-equal
        to the uninterrupted run) when the data module cannot re-create a batch by index.
    """
    source = getattr(getattr(trainer, "datamodule", None), "train_batch", None)
    if source is None:
        rank_zero_warn(
            "resuming inside a teacher_reuse group, but the data module has no train_batch(index) to re-read the "
            "batch the interrupted run captured: this step captures its own batch, so the resumed run is not "
            "bit-equal to an uninterrupted one (WikipediaDataModule has train_batch; or checkpoint at multiples of "
            "teacher_reuse steps)"
        )
        return None
    return trainer.strategy.batch_to_device(source(index))
