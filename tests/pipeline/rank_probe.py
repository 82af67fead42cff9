"""A callback for the 2-process tests: each rank writes what it sees, so a test can compare ranks and runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import lightning as L
import torch


class RankProbe(L.Callback):
    """Write ``<out_dir>/<event>_rank<r>.pt`` at train start, at train end and, with ``kill_at``, after that optimizer
    step, which then raises (a killed run): ``twins`` (parameters and buffers of the linear twins, by name), ``lora``
    (LoRA adapter parameters, by name), ``feature_dims``, ``dof`` (the report as a dict), ``step``,
    ``replicated_teacher`` / ``sharded_twins`` (names of teacher parameters that are not DTensors and twins that are),
    and what the rank has seen so far: ``input_ids`` (each training batch's), ``phases`` (``"tail"`` or ``"layerwise"``
    per training batch, for phases with an end-to-end tail), ``validated_at`` (global step of each validation run,
    sanity checks excluded) and ``metrics`` (``trainer.callback_metrics`` as floats).

    Args:
        out_dir: the folder to write to (created).
        kill_at: raise after this global step (0: never).
    """

    def __init__(self, out_dir: str, kill_at: int = 0) -> None:
        self.out_dir, self.kill_at = Path(out_dir), kill_at
        self.input_ids: list[torch.Tensor] = []
        self.phases: list[str] = []
        self.validated_at: list[int] = []

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self._write(trainer, pl_module, "start")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        self.input_ids.append(batch["input_ids"].detach().cpu().clone())
        in_finetune = getattr(pl_module, "in_finetune", None)
        self.phases.append("layerwise" if in_finetune is None or not in_finetune() else "tail")

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validated_at.append(trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, *args) -> None:
        if self.kill_at and trainer.global_step == self.kill_at:
            self._write(trainer, pl_module, "killed")
            raise RuntimeError(f"RankProbe: killed after step {self.kill_at}")

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        self._write(trainer, pl_module, "end")

    def _write(self, trainer: L.Trainer, pl_module, event: str) -> None:
        from torch.distributed.tensor import DTensor

        student = pl_module.student
        states = [*student.named_parameters(), *student.named_buffers()]
        twins = {n: t.detach().clone() for n, t in states if ".lit_dof." in n}
        report = pl_module.plan.report
        self.out_dir.mkdir(parents=True, exist_ok=True)
        sharded = {n: isinstance(p, DTensor) for n, p in student.named_parameters()}
        torch.save({
            "twins": twins, "feature_dims": student.feature_dims, "step": trainer.global_step,
            "lora": {n: p.detach().clone() for n, p in student.named_parameters() if ".lora_" in n},
            "dof": None if report is None else dataclasses.asdict(report),
            "replicated_teacher": [n for n, dt in sharded.items() if ".lit_dof." not in n and not dt],
            "sharded_twins": [n for n, dt in sharded.items() if ".lit_dof." in n and dt],
            "input_ids": list(self.input_ids), "phases": list(self.phases), "validated_at": list(self.validated_at),
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        }, self.out_dir / f"{event}_rank{trainer.global_rank}.pt")  # fmt: skip  # packed args
