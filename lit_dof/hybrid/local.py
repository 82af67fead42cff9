"""Local distillation loss of every linear twin on given data: how well each twin, alone, reproduces its
block's attention output on the teacher's own inputs (Distill-then-Replace's local objective, arXiv
2601.11667 §3.1; the ``output`` loss of :func:`~lit_dof.students.losses.attention_output_loss`).

It ranks layers for the local-loss-guided ordering and the search's shortlist, measured on the target
task's own data rather than the distillation corpus.
"""

from __future__ import annotations

import torch

from lit_dof.students.losses import output_error_sums
from lit_dof.teacher.capture import CapturedAttention, capture_attention


def valid_positions(batch: dict) -> torch.Tensor:
    """``(B, T)`` bool: True up to each row's last real token. Uses ``attention_mask`` when present, else
    the last continuation target of a :func:`~lit_dof.evaluation.multiple_choice.collate_choices` batch, else
    every position."""
    ids = batch["input_ids"]
    if batch.get("attention_mask") is not None:
        return batch["attention_mask"].bool()
    if "targets" in batch:
        positions = torch.arange(ids.shape[1], device=ids.device)
        last = torch.where(batch["targets"] != -100, positions, -1).amax(-1)  # (B,)
        return positions[None, :] <= last[:, None]
    return torch.ones_like(ids, dtype=torch.bool)


def local_losses(student, batches: list[dict]) -> dict[int, float]:
    """Relative output error Σ‖ŷ − y‖² / Σ‖y‖² of each layer's twin over ``batches`` (0: exact match).

    One teacher forward per batch (``student.teacher_mode()``) captures every layer's q, k, v and attention
    output; each twin then runs on its own layer's inputs. Errors and norms are summed over all batches
    before dividing.

    Args:
        student: a :class:`~lit_dof.students.LitDofForCausalLM` with a twin per candidate layer.
        batches: ``[{"input_ids": (B, T), ...}]`` (right padding; see :func:`valid_positions`).

    Returns:
        ``{layer index: loss}`` for every layer that has a twin.

    Raises:
        ValueError: no batches, or a student without twins.
    """
    twins = student.linear_modules()
    if not batches or not twins:
        raise ValueError("local_losses needs at least one batch and a student with linear twins")
    err = {i: 0.0 for i in twins}
    norm = {i: 0.0 for i in twins}
    for batch in batches:
        valid = valid_positions(batch)
        captured: dict[int, CapturedAttention] = {}

        def record(index: int, c: CapturedAttention) -> None:
            captured[index] = c

        with torch.no_grad(), student.teacher_mode(), capture_attention(student.model, record):
            student(batch["input_ids"], use_cache=False)
        with torch.no_grad():
            for index, twin in twins.items():
                c = captured[index]
                e, n = output_error_sums(twin, c.q, c.k, c.v, c.out, valid, c.rotary)
                err[index] += float(e)
                norm[index] += float(n)
    return {i: err[i] / max(norm[i], torch.finfo(torch.float32).tiny) for i in twins}
