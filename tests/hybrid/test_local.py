"""Local losses of the twins: equal to a direct computation; padding excluded."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF
from lit_dof.hybrid.local import local_losses, valid_positions
from lit_dof.students import linearize
from tests.conftest import tiny_model


def test_local_losses_match_a_direct_computation_and_vanish_for_exact_twins():
    from lit_dof.students.losses import attention_output_loss
    from lit_dof.teacher.capture import capture_attention

    torch.manual_seed(0)
    student = linearize(tiny_model("llama"), LearnedPRF, 8).eval()
    ids = torch.randint(3, 97, (2, 12))
    losses = local_losses(student, [{"input_ids": ids}])
    captured = {}

    def record(i, c):
        captured[i] = (c.q, c.k, c.v, c.out)

    with torch.no_grad(), student.teacher_mode(), capture_attention(student.model, record):
        student(ids)
    for index, twin in student.linear_modules().items():
        q, k, v, out = captured[index]
        with torch.no_grad():
            assert losses[index] == pytest.approx(float(attention_output_loss(twin, q, k, v, out)), rel=1e-5)
    assert all(v > 0 for v in losses.values())
    # right padding: positions after the last continuation target are excluded
    batch = {"input_ids": ids, "targets": torch.full_like(ids, -100)}
    batch["targets"][0, 4:7] = ids[0, 4:7]
    batch["targets"][1, 2:12] = ids[1, 2:12]
    assert valid_positions(batch).sum(-1).tolist() == [7, 12]
