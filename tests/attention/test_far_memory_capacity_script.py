"""tools/far_memory_capacity.py: each memory's read-back against an independent computation — the additive one
against the float64 quadratic reference (the last query row sees every key), the delta rule against the sequential
float64 recurrence — and the closed form that the delta rule gives the last written value back exactly (β = 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lit_dof.attention import LearnedPRF
from lit_dof.attention.ops.delta_rule.naive import naive_delta_rule
from lit_dof.attention.ops.linear.naive import log_kernel_matrix
from tests.conftest import load_script


def test_read_back_matches_the_references_and_the_last_write_is_exact():
    tool = load_script("far_memory_capacity", "tools")
    g = torch.Generator().manual_seed(0)
    fm = LearnedPRF(16, 1, 12, seed=0)
    keys, values = torch.randn(1, 1, 30, 16, generator=g) * 0.7, torch.randn(30, 5, generator=g)
    with torch.no_grad():
        log_phi = fm.log_features(keys)[0, 0]
    weights = torch.softmax(log_kernel_matrix(log_phi.double()[None, None], log_phi.double()[None, None])[0, 0], -1)
    additive = tool.read_back("additive", log_phi, values).double()
    torch.testing.assert_close(additive, weights @ values.double(), rtol=1e-5, atol=1e-5)
    unit = F.normalize((log_phi.double() - log_phi.double().amax(-1, keepdim=True)).exp(), dim=-1)[None, None]
    _, state = naive_delta_rule(unit, unit, values.double()[None, None], torch.ones(1, 1, 30, dtype=torch.float64))
    delta = tool.read_back("delta", log_phi, values)
    torch.testing.assert_close(delta.double(), unit[0, 0] @ state[0, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(delta[-1], values[-1], rtol=1e-4, atol=1e-4)  # β = 1: the last write reads back
