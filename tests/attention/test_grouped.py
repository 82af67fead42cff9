"""Per-head feature dims: a layer whose KV heads have their own M equals, head by head, single-head layers
with the same parameters; continues from its state; trains through the layer loss like the ungrouped layer."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import CausalLinearAttention, LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.layers.grouped import HeadGroupedAttention, head_groups
from lit_dof.students.losses import attention_distillation_loss

HQ, HK, D = 6, 3, 8  # GQA group 2


def _build(window=0):
    def build(num_heads, num_kv_heads, feature_dim):
        fm = LearnedPRF(D, num_kv_heads, feature_dim)
        if window:
            return SlidingWindowLinearAttention(
                fm, num_heads, num_kv_heads, sliding_window=SlidingWindow(window=window, sink_tokens=1), chunk_size=8
            )
        return CausalLinearAttention(fm, num_heads, num_kv_heads, chunk_size=8)

    return build


def _single_head(grouped: HeadGroupedAttention, kv_head: int, window=0) -> CausalLinearAttention:
    """A one-KV-head layer carrying ``kv_head``'s parameters out of its group."""
    for layer, heads in zip(grouped.groups, grouped._kv_index):
        if kv_head in heads:
            j = heads.index(kv_head)
            single = _build(window)(HQ // HK, 1, layer.feature_map.feature_dim)
            with torch.no_grad():
                single.feature_map.z.copy_(layer.feature_map.z[j : j + 1])
                single.feature_map.log_alpha.copy_(layer.feature_map.log_alpha[j : j + 1])
                if window:
                    g = HQ // HK
                    single.log_mix.copy_(layer.log_mix[j * g : (j + 1) * g])
            return single
    raise AssertionError(kv_head)


def test_head_groups_sort_by_dimension():
    assert head_groups([16, 8, 16, 4]) == [(4, [3]), (8, [1]), (16, [0, 2])]
    with pytest.raises(ValueError, match="KV head 1"):
        head_groups([4, -1])


@pytest.mark.parametrize("window", [0, 4], ids=["linear", "window4"])
def test_each_head_equals_a_single_head_layer(window):
    torch.manual_seed(0)
    grouped = HeadGroupedAttention(_build(window), [12, 4, 12], HQ)
    if window:
        with torch.no_grad():
            for layer in grouped.groups:
                layer.log_mix.normal_()
    assert [layer.feature_map.feature_dim for layer in grouped.groups] == [4, 12]
    q, k, v = torch.randn(2, HQ, 19, D), torch.randn(2, HK, 19, D), torch.randn(2, HK, 19, 5)
    y, state = grouped(q, k, v)
    G = HQ // HK
    for h in range(HK):
        ref, _ = _single_head(grouped, h, window)(q[:, h * G : (h + 1) * G], k[:, h : h + 1], v[:, h : h + 1])
        torch.testing.assert_close(y[:, h * G : (h + 1) * G], ref)
    # state bytes follow Σ M (not Hk · max M)
    if not window:
        assert state.nbytes == 2 * sum([12, 4, 12]) * (5 + 2) * 4


def test_prefill_then_decode_equals_one_pass():
    torch.manual_seed(1)
    grouped = HeadGroupedAttention(_build(3), [8, 4, 4], HQ)
    q, k, v = torch.randn(1, HQ, 14, D), torch.randn(1, HK, 14, D), torch.randn(1, HK, 14, 5)
    full, _ = grouped(q, k, v)
    y, state = grouped(q[:, :, :9], k[:, :, :9], v[:, :, :9])
    outs = [y]
    for t in range(9, 14):
        y, state = grouped(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-5, atol=1e-6)


def test_loss_with_equal_dims_equals_the_ungrouped_layer():
    torch.manual_seed(2)
    grouped = HeadGroupedAttention(_build(), [8, 8, 8], HQ)
    plain = CausalLinearAttention(grouped.groups[0].feature_map, HQ, HK)  # the same map, all heads in one group
    q, k = 1.5 * torch.randn(2, HQ, 12, D), 1.5 * torch.randn(2, HK, 12, D)
    torch.testing.assert_close(attention_distillation_loss(grouped, q, k), attention_distillation_loss(plain, q, k))
