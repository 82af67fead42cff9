"""Exact KV heads (feature dim 0): the group is causal softmax against a float64 loop over queries, continues from
its KV state like one pass, sits beside linear groups in a per-head layer, and is left out of the layer losses."""

from __future__ import annotations

import math

import pytest
import torch

from lit_dof.attention.layers.exact import ExactAttention, ExactKVState
from lit_dof.attention.layers.grouped import HeadGroupedAttention, head_groups
from lit_dof.students.losses import attention_distillation_loss, attention_output_loss
from tests.attention.test_grouped import HK, HQ, D, _build


def _reference(q, k, v, valid):
    """Causal softmax by hand in float64, one query at a time: query i sits at stream index L − T + i and sees
    the valid keys up to it (itself always)."""
    B, Hq, T, d = q.shape
    L, group = k.shape[2], Hq // k.shape[1]
    out = torch.zeros(B, Hq, T, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            for i in range(T):
                p = L - T + i
                keys = [j for j in range(p + 1) if valid[b, j] or j == p]
                logits = torch.stack([q[b, h, i].double() @ k[b, h // group, j].double() for j in keys]) / math.sqrt(d)
                weights = logits.softmax(0)
                out[b, h, i] = sum(w * v[b, h // group, j].double() for w, j in zip(weights, keys))
    return out


def _qkv(T=9, Tk=None, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    Tk = Tk or T
    q = 2 * torch.randn(2, HQ, T, D, generator=g, dtype=dtype)
    k = 2 * torch.randn(2, HK, Tk, D, generator=g, dtype=dtype)
    v = torch.randn(2, HK, Tk, D, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("prefix", [0, 3], ids=["self", "prefix-keys"])
def test_exact_group_is_causal_softmax_over_the_valid_keys(prefix):
    q, k, v = _qkv(T=9, Tk=9 + prefix)
    valid = torch.ones(2, 9 + prefix, dtype=torch.bool)
    valid[1, :4] = False  # left padding in the second row
    y, state = ExactAttention(HQ, HK)(q, k, v, key_padding_mask=valid)
    torch.testing.assert_close(y, _reference(q, k, v, valid), rtol=1e-12, atol=1e-12)
    assert y.dtype == torch.float64 and isinstance(state, ExactKVState)
    assert state.nbytes == 2 * (9 + prefix) * (2 * HK * D * 8 + 1)  # keys, values and a flag per token and row


def test_prefill_then_decode_equals_one_pass_and_the_state_follows_the_batch():
    q, k, v = _qkv(T=11, dtype=torch.float32)
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[0, :2] = False
    layer = ExactAttention(HQ, HK)
    whole, _ = layer(q, k, v, key_padding_mask=valid)
    y, state = layer(q[:, :, :6], k[:, :, :6], v[:, :, :6], key_padding_mask=valid[:, :6])
    parts = [y]
    for t in range(6, 11):
        y, state = layer(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state, valid[:, t : t + 1])
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=1e-5, atol=1e-6)
    assert state.keys.shape == (2, HK, 11, D) and torch.equal(state.valid, valid)
    swapped = state.index_select(0, torch.tensor([1, 0]))
    assert torch.equal(swapped.keys[0], state.keys[1]) and torch.equal(swapped.valid[1], state.valid[0])
    assert state.repeat_interleave(3).keys.shape[0] == 6


def test_exact_heads_sort_first_and_other_dims_stay_positive_integers():
    assert head_groups([16, 0, 8, 0]) == [(0, [1, 3]), (8, [2]), (16, [0])]
    with pytest.raises(ValueError, match="KV head 1 must be an integer >= 0"):
        head_groups([4, -1])
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ExactAttention(3, 2)


@pytest.mark.parametrize("window", [0, 4], ids=["linear", "window4"])
def test_per_head_layer_runs_exact_heads_beside_linear_ones(window):
    q, k, v = _qkv(T=10, dtype=torch.float32)
    layer = HeadGroupedAttention(_build(window), [8, 0, 8], HQ)
    assert layer.exact_heads == [1] and layer.feature_dim_total == 16 and len(layer.twins) == 1 and layer.far_term
    y, state = layer(q, k, v)
    exact = [2, 3]  # the query heads of KV head 1 (GQA group 2)
    valid = torch.ones(2, 10, dtype=torch.bool)
    reference = _reference(q[:, exact], k[:, 1:2], v[:, 1:2], valid)
    torch.testing.assert_close(y[:, exact].double(), reference, rtol=1e-5, atol=1e-5)
    twin = layer.twins[0]  # KV heads 0 and 2, query heads 0, 1, 4, 5
    y_twin, _ = twin(q[:, [0, 1, 4, 5]], k[:, [0, 2]], v[:, [0, 2]])
    torch.testing.assert_close(y[:, [0, 1, 4, 5]], y_twin, rtol=0, atol=0)
    assert state.nbytes == sum(s.nbytes for s in state.states) and isinstance(state.states[0], ExactKVState)
    assert not HeadGroupedAttention(_build(window), [0, 0, 0], HQ).far_term  # nothing left to distil


@pytest.mark.parametrize("window", [0, 4], ids=["linear", "window4"])
def test_layer_losses_leave_the_exact_heads_out(window):
    q, k, v = _qkv(T=12, dtype=torch.float32)
    layer = HeadGroupedAttention(_build(window), [8, 0, 8], HQ)
    twin, heads, kv = layer.twins[0], [0, 1, 4, 5], [0, 2]
    loss = attention_distillation_loss(layer, q, k, None, kind="softmax")
    torch.testing.assert_close(loss, attention_distillation_loss(twin, q[:, heads], k[:, kv], None, kind="softmax"))
    with torch.no_grad():
        out, _ = layer(q, k, v)  # a target whose exact heads match and linear heads do not
        out[:, heads] += 0.5
    target = out.transpose(1, 2)
    own = attention_output_loss(twin, q[:, heads], k[:, kv], v[:, kv], target[:, :, heads])
    torch.testing.assert_close(attention_output_loss(layer, q, k, v, target), own)
    everything = HeadGroupedAttention(_build(window), [0, 0, 0], HQ)
    for call in (
        lambda: attention_distillation_loss(everything, q, k, None, kind="softmax"),
        lambda: attention_output_loss(everything, q, k, v, target),
    ):
        with pytest.raises(ValueError, match="every KV head of this layer is exact"):
            call()
