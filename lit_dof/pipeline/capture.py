"""The teacher-capture phase (``lit-dof predict``): sample post-RoPE q/k of the frozen teacher, write them
and their DoF report for later phases (a ``fit``'s ``DoFPlanner`` reads it: ``report_path=<dir>/dof.json``,
:mod:`lit_dof.pipeline.planner`).

Memory stays bounded for any number of batches (:class:`~lit_dof.teacher.capture.QKReservoir`: J vectors
per head). Writes ``<output_dir>/qk_samples.pt`` (``{layer: (H, J, d)}``) and ``<output_dir>/dof.json``,
both atomically; under DDP every rank samples its own shard and rank 0 writes (samples of rank 0).
"""

from __future__ import annotations

import os
from typing import Literal

import lightning as L
import torch

from lit_dof.dof import dof_report
from lit_dof.dof.estimator import RelativeTo
from lit_dof.io import atomic_file
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.capture import QKReservoir, capture_attention, pooled_vectors


class TeacherCapture(L.LightningModule):
    """Capture phase as a LightningModule (``predict``).

    Args:
        teacher: alias, directory, ``.gguf`` or hub id.
        seq_len: block length in tokens (linked from ``data.seq_len`` by the CLI).
        num_samples: J, the q/k samples kept per head.
        pooling: ``"query_head"`` or ``"kv_head"``.
        lam: ridge λ of the written report, or ``"auto"`` (``target_fraction`` of J; see ``estimate_model_dof``).
        relative_to: ``None`` (absolute λ), ``"trace"`` or ``"max_eigenvalue"``.
        target_fraction: with ``lam="auto"``, the mean layer DoF as a fraction of J, in (0, 1).
        output_dir: where to write (default: the trainer's log directory).
        seed: sampling seed: which q/k rows the reservoir keeps, and the draws of the ``"auto"`` λ search.
    """

    def __init__(
        self,
        teacher: str = DEFAULT_TEACHER,
        seq_len: int = 512,
        num_samples: int = 1024,
        pooling: Literal["query_head", "kv_head"] = "query_head",
        lam: float | str = "auto",
        relative_to: RelativeTo | None = None,
        target_fraction: float = 0.25,
        output_dir: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.teacher_name, self.seq_len = teacher, seq_len
        self.num_samples, self.pooling, self.seed = num_samples, pooling, seed
        self.lam, self.relative_to, self.target_fraction = lam, relative_to, target_fraction
        self.output_dir = output_dir
        self.teacher = None
        self.reservoir = QKReservoir(num_samples, seed=seed)
        self.tokens = 0

    def configure_model(self) -> None:
        """Load the frozen teacher (once)."""
        if self.teacher is None:
            from lit_dof.teacher.loading import load_teacher

            self.teacher, _ = load_teacher(self.teacher_name)

    def predict_step(self, batch: dict, batch_idx: int) -> None:
        """Run the teacher on ``batch`` and add each layer's pooled q/k vectors to the reservoir; count its tokens."""

        def record(index: int, c) -> None:
            self.reservoir.add(index, pooled_vectors(c.q, c.k, c.key_padding, self.pooling))

        with capture_attention(self.teacher, record):
            self.teacher(batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
        self.tokens += int(batch["input_ids"].numel())

    def on_predict_end(self) -> None:
        """On rank 0: estimate the degrees of freedom from the reservoir and write ``dof.json`` to ``output_dir``."""
        log_dir = self.trainer.log_dir  # collective under DDP
        if not self.trainer.is_global_zero:
            return
        out = self.output_dir or log_dir or "."
        os.makedirs(out, exist_ok=True)
        lam = self.lam if self.lam == "auto" else float(self.lam)
        report = dof_report(
            self.teacher,
            self.reservoir,
            self.tokens,
            lam,
            relative_to=self.relative_to,
            pooling=self.pooling,
            target_fraction=self.target_fraction,
            seed=self.seed,
            name=self.teacher_name,
        )
        report.save(os.path.join(out, "dof.json"))
        with atomic_file(os.path.join(out, "qk_samples.pt")) as handle:
            torch.save({i: v.clone() for i, v in self.reservoir.vectors.items()}, handle)
        self.report = report
