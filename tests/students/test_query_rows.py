"""Query rows drawn by position strata: the draw itself, and the layer loss it gives against a closed form."""

import pytest
import torch

from lit_dof.attention import CausalLinearAttention, LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.students.losses import _row_sums, attention_distillation_loss
from lit_dof.students.query_rows import StratifiedRows, scored_rows, select_rows


def test_each_stratum_gives_its_share_of_distinct_sorted_rows():
    rows = StratifiedRows(count=12, bounds=(8, 32))
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        idx = rows.select(100, g)
        assert idx.tolist() == sorted(set(idx.tolist())) and 0 <= idx.min() and idx.max() < 100
        assert [int(((idx >= a) & (idx < b)).sum()) for a, b in ((0, 8), (8, 32), (32, 100))] == [4, 4, 4]


def test_the_remainder_goes_to_the_first_strata_and_a_short_stratum_gives_all_its_rows():
    g = torch.Generator().manual_seed(1)
    idx = StratifiedRows(count=8, bounds=(10, 20)).select(30, g)  # 8 = 3 + 3 + 2
    assert [int(((idx >= a) & (idx < b)).sum()) for a, b in ((0, 10), (10, 20), (20, 30))] == [3, 3, 2]
    idx = StratifiedRows(count=10, bounds=(2,)).select(40, g)  # [0, 2) holds 2 of its 5
    assert idx[:2].tolist() == [0, 1] and len(idx) == 7


def test_a_sequence_inside_the_first_stratum_is_drawn_uniformly():
    g = torch.Generator().manual_seed(2)
    counts = torch.zeros(16)
    for _ in range(4000):
        idx = StratifiedRows(count=4, bounds=(512,)).select(16, g)
        assert len(idx) == 4
        counts[idx] += 1
    assert torch.allclose(counts / 4000, torch.full((16,), 4 / 16), atol=0.03)  # each position's share of the draws
    assert select_rows(16, StratifiedRows(count=40, bounds=(8,)), g, "cpu").tolist() == list(range(16))


def test_the_draw_is_uniform_within_each_stratum():
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(40)
    for _ in range(4000):
        counts[StratifiedRows(count=4, bounds=(8,)).select(40, g)] += 1
    frequency = counts / 4000
    assert torch.allclose(frequency[:8], torch.full((8,), 2 / 8), atol=0.03)
    assert torch.allclose(frequency[8:], torch.full((32,), 2 / 32), atol=0.02)


BAD_STRATA = [
    (1, (4,), "count must be an integer >= 2"),
    (2.0, (), "count"),
    (4, (8, 8), "strictly increasing"),
    (4, (0,), "strictly increasing"),
    (4, (True,), "strictly increasing"),
]


@pytest.mark.parametrize(("count", "bounds", "match"), BAD_STRATA)
def test_bad_strata_name_the_problem(count, bounds, match):
    with pytest.raises(ValueError, match=match):
        StratifiedRows(count=count, bounds=bounds)


def test_the_memory_plan_counts_the_rows_a_draw_can_score():
    assert scored_rows(2048, StratifiedRows(count=384, bounds=(256, 512))) == 384
    assert scored_rows(256, StratifiedRows(count=384, bounds=(256, 512))) == 256
    assert scored_rows(2048, 128) == 128 and scored_rows(64, None) == 64


def test_the_stratified_loss_weights_each_stratum_equally():
    """E[loss] over the draws = ½ (mean row loss on [0, b)) + ½ (mean row loss on [b, T)); a causal twin's rows
    on [0, b) are the whole loss of the b-token prefix, so both means come from full-row losses (a closed form)."""
    torch.manual_seed(0)
    twin = CausalLinearAttention(LearnedPRF(8, 2, 16, seed=0), num_heads=4, num_kv_heads=2)
    T, b = 24, 4
    q, k = 1.5 * torch.randn(2, 4, T, 8), 1.5 * torch.randn(2, 2, T, 8)
    full = attention_distillation_loss(twin, q, k).item()
    prefix = attention_distillation_loss(twin, q[:, :, :b], k[:, :, :b]).item()
    rest = (T * full - b * prefix) / (T - b)
    expected = (prefix + rest) / 2
    g = torch.Generator().manual_seed(0)
    rows = StratifiedRows(count=4, bounds=(b,))
    draws = torch.stack([attention_distillation_loss(twin, q, k, query_rows=rows, generator=g) for _ in range(2000)])
    assert abs(expected - full) > 0.1 * full  # the two weightings differ here, so the check can tell them apart
    assert draws.mean().item() == pytest.approx(expected, rel=0.03)


def _rotary(T: int, r: int = 8):
    angles = torch.rand(T, r // 2) * 6.0
    return torch.cat([angles.cos(), angles.cos()], -1)[None], torch.cat([angles.sin(), angles.sin()], -1)[None]


@pytest.mark.parametrize(
    "options",
    [
        dict(far_decay=16.0, far_decay_spread=16.0, learn_decay=True, far_rope=False),
        dict(far_decay=40.0, far_gate=True),
    ],
    ids=["decay-per-feature-unrotated", "gated"],
)
def test_strata_scored_on_their_prefixes_equal_the_same_rows_scored_on_the_whole_sequence(options):
    """The loss scores each stratum on the prefix that ends there (a causal row sees no later key): the same rows
    scored against every key — the direct computation — give the same loss, decay, gates and rotation included."""
    torch.manual_seed(0)
    T, rows = 40, StratifiedRows(count=9, bounds=(7, 19))
    twin = SlidingWindowLinearAttention(
        LearnedPRF(8, 2, 6, seed=1), 4, 2, sliding_window=SlidingWindow(window=5, sink_tokens=2, **options)
    )
    if twin.far_gated:
        with torch.no_grad():
            twin.far_gate_weight.normal_(0, 2.0)
    q, k, v = 1.5 * torch.randn(2, 4, T, 8), 1.5 * torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8)
    valid = torch.ones(2, T, dtype=torch.bool)
    valid[1, :3] = False
    rotary = _rotary(T)
    picked = rows.select(T, torch.Generator().manual_seed(5))
    total, count = _row_sums(twin, q, k, valid, picked, "softmax", True, rotary, v)
    got = attention_distillation_loss(
        twin, q, k, valid, query_rows=rows, generator=torch.Generator().manual_seed(5), rotary=rotary, values=v
    )
    assert len(picked) == 9 and count > 0
    torch.testing.assert_close(got, (total / count).float(), rtol=1e-5, atol=1e-7)
