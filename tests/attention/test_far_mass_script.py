"""tools/far_mass.py's per-layer masses against the float64 naive sliding-window reference."""

from __future__ import annotations

import math

import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from tests.conftest import load_script


def _script():
    return load_script("far_mass", "tools")


def test_far_shares_and_log_ratio_match_the_reference_attention_matrix():
    """With one-hot values the reference's output is the student's attention matrix: the far share is its mass on
    keys sinks ≤ j ≤ i − w; the teacher's is the softmax's; the exact parts are shared, so the far sums' log ratio
    is logit(student share) − logit(teacher share)."""
    torch.manual_seed(3)
    window, sinks, T = 3, 2, 14
    fm = LearnedPRF(8, 2, 16, seed=3)
    twin = SlidingWindowLinearAttention(fm, 4, 2, sliding_window=SlidingWindow(window=window, sink_tokens=sinks))
    with torch.no_grad():
        twin.log_mix.normal_()
    q, k = 1.5 * torch.randn(1, 4, T, 8), 1.5 * torch.randn(1, 2, T, 8)
    rows = torch.tensor([5, 9, 13])  # each has far keys
    result = _script()._layer_masses(twin, q, k, rows)

    lq, lk = fm.log_features(q.reshape(1, 2, 2 * T, 8)).view(1, 4, T, -1), fm.log_features(k)
    onehot = torch.eye(T, dtype=torch.float64).expand(1, 2, T, T)
    p_hat = naive_sliding_window_attention(
        q.double(), k.double(), onehot, lq, lk, window=window, sink_tokens=sinks, log_mix=twin.log_mix.detach()
    )[0]  # (Hq, T, T)
    logits = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)
    p = logits.masked_fill(~torch.ones(T, T).tril().bool(), -torch.inf).softmax(-1)[0]
    j = torch.arange(T)
    far = (j[None, :] >= sinks) & (j[None, :] <= rows[:, None] - window)  # (n, T)
    student = (p_hat[:, rows] * far).sum(-1)
    teacher = (p[:, rows] * far).sum(-1)
    torch.testing.assert_close(result["student"], student, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(result["teacher"], teacher, rtol=1e-9, atol=1e-12)
    logit = lambda x: x.log() - (1 - x).log()  # noqa: E731
    torch.testing.assert_close(result["log_ratio"], logit(student) - logit(teacher), rtol=1e-4, atol=1e-5)
