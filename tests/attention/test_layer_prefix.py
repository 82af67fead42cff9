"""CausalLinearAttention with a key prefix and key padding; accumulate_state against the chunked state."""

import torch

from lit_dof.attention import CausalLinearAttention, LearnedPRF, accumulate_state, chunked_linear_attention
from lit_dof.attention.ops.linear.naive import naive_linear_attention


def test_accumulate_state_equals_chunked_state():
    g = torch.Generator().manual_seed(0)
    lq, lk, v = (
        torch.randn(2, 4, 37, 8, generator=g),
        5 * torch.randn(2, 2, 37, 8, generator=g),
        torch.randn(2, 2, 37, 5, generator=g),
    )
    _, s1 = chunked_linear_attention(lq, lk, v, chunk_size=8)
    s2 = accumulate_state(lk[:, :, 20:], v[:, :, 20:], initial_state=accumulate_state(lk[:, :, :20], v[:, :, :20]))
    for a, b in ((s1.kv, s2.kv), (s1.k_sum, s2.k_sum), (s1.log_scale, s2.log_scale)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_key_prefix_equals_last_rows_of_full_sequence():
    torch.manual_seed(0)
    layer = CausalLinearAttention(LearnedPRF(16, 2, 12), num_heads=4, num_kv_heads=2)
    q, k, v = torch.randn(2, 4, 30, 16), torch.randn(2, 2, 30, 16), torch.randn(2, 2, 30, 16)
    full, _ = layer(q, k, v)
    tail, _ = layer(q[:, :, 25:], k, v)  # the 25 earlier keys are a prefix without queries
    torch.testing.assert_close(tail, full[:, :, 25:], rtol=1e-5, atol=1e-6)


def test_key_padding_matches_naive_with_masked_keys():
    torch.manual_seed(1)
    fm = LearnedPRF(16, 2, 12)
    layer = CausalLinearAttention(fm, num_heads=4, num_kv_heads=2, chunk_size=4)
    q, k, v = 2 * torch.randn(2, 4, 19, 16), 2 * torch.randn(2, 2, 19, 16), torch.randn(2, 2, 19, 16)
    valid = torch.ones(2, 19, dtype=torch.bool)
    valid[0, :7] = False  # left padding longer than a chunk
    valid[1, 15:] = False  # right padding
    y, _ = layer(q, k, v, key_padding_mask=valid)
    log_q = fm.log_features(q.reshape(2, 2, -1, 16)).reshape(2, 4, 19, -1)
    log_k = fm.log_features(k).masked_fill(~valid[:, None, :, None], float("-inf"))
    expected = naive_linear_attention(log_q, log_k, v)
    rows = valid[:, None, :, None].expand_as(y)  # padding queries are meaningless
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[rows], expected[rows].float(), rtol=1e-4, atol=1e-5)
