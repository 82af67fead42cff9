"""tools/far_mass.py's per-layer masses against the float64 naive sliding-window reference."""

from __future__ import annotations

import math

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.layers.grouped import HeadGroupedAttention
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


@pytest.mark.parametrize("spread", [None, 4.0], ids=["per-head", "per-feature"])
def test_a_decaying_far_term_in_a_per_head_layer_matches_the_reference_and_skips_its_exact_heads(spread):
    """A per-head layer (KV head 0 exact, heads 1 and 2 windowed with M = 16 and 8) whose far terms decay at their own
    learned rates (one per head or one per feature): each windowed group's shares are the float64 reference's (far
    pairs weighted e^{−λ(i − w − j)}), in group order, and the exact head contributes no row."""
    torch.manual_seed(4)
    window, sinks, T, d = 3, 1, 16, 8
    options = SlidingWindow(
        window=window, sink_tokens=sinks, far_decay=4.0, far_decay_spread=spread, learn_decay=True, gate_min_decay=1.0
    )

    def build(hq: int, hk: int, m: int) -> SlidingWindowLinearAttention:
        return SlidingWindowLinearAttention(LearnedPRF(d, hk, m, seed=m), hq, hk, sliding_window=options)

    layer = HeadGroupedAttention(build, [0, 16, 8], num_heads=6)
    with torch.no_grad():
        for twin in layer.twins:
            twin.log_mix.normal_()
            twin.far_log_decay.uniform_(-2.5, -0.5)  # λ between 0.08 and 0.6 per token (per head or feature)
    q, k = 1.5 * torch.randn(1, 6, T, d), 1.5 * torch.randn(1, 3, T, d)
    rows = torch.tensor([6, 10, 15])
    result = _script()._layer_masses(layer, q, k, rows)
    assert result["student"].shape == (4, 3)  # 2 windowed KV heads × 2 query heads each; the exact head left out

    j = torch.arange(T)
    far = (j[None, :] >= sinks) & (j[None, :] <= rows[:, None] - window)  # (n, T)
    student, teacher = [], []
    for twin, q_g, k_g, _ in layer.split(q, k):
        if not hasattr(twin, "window"):  # the exact group
            continue
        lq, lk = twin.exact_log_features(q_g, k_g)
        onehot = torch.eye(T, dtype=torch.float64).expand(1, 1, T, T)
        p_hat = naive_sliding_window_attention(
            q_g.double(),
            k_g.double(),
            onehot,
            lq,
            lk,
            window=window,
            sink_tokens=sinks,
            log_mix=twin.log_mix.detach(),
            far_decay=twin.decay_rates().detach(),
        )[0]  # (2, T, T)
        logits = q_g.double() @ k_g.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(d)
        p = logits.masked_fill(~torch.ones(T, T).tril().bool(), -torch.inf).softmax(-1)[0]
        student.append((p_hat[:, rows] * far).sum(-1))
        teacher.append((p[:, rows] * far).sum(-1))
    torch.testing.assert_close(result["student"], torch.cat(student), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(result["teacher"], torch.cat(teacher), rtol=1e-9, atol=1e-12)
