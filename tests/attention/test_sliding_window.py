"""Sliding-window + linear attention against the quadratic float64 reference: forward, gradients, GQA,
padding, sinks, the learned mixing weight, chunked prefill and token-by-token decoding.

The window part computes in the inputs' float64; the far part's linear kernel accumulates in float32 by
contract (its state is float32), hence tolerances of float32 rounding."""

import pytest
import torch

from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention, sliding_window_masks


def _inputs(B, Hq, Hk, T, d=8, M=6, D=5, q_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, d, generator=g) * q_scale
    k = torch.randn(B, Hk, T, d, generator=g)
    v = torch.randn(B, Hk, T, D, generator=g)
    lq = torch.randn(B, Hq, T, M, generator=g) * 1.5
    lk = torch.randn(B, Hk, T, M, generator=g) * 1.5
    mix = torch.randn(Hq, generator=g)
    return q, k, v, lq, lk, mix


def _run(q, k, v, lq, lk, mix, **kw):
    return sliding_window_linear_attention(q, k, v, lq, lk, log_mix=mix, **kw)[0]


CASES = {  # (T, window, sinks, chunk)
    "T1": (1, 4, 0, 64),
    "T37-w5-C8": (37, 5, 0, 8),
    "T37-w5-s3-C8": (37, 5, 3, 8),
    "T50-w1-s1-C16": (50, 1, 1, 16),
    "T67-w16-s4-C16": (67, 16, 4, 16),
    "T67-w64-s2-C64": (67, 64, 2, 64),
    "T20-w100-s2-C8": (20, 100, 2, 8),  # window longer than the sequence: no far term at all
    "T45-w7-s50-C8": (45, 7, 50, 8),  # every key is a sink: exact attention
}
LAYOUTS = {"mha": (3, 3), "gqa": (4, 2)}
TOL = {"rtol": 1e-5, "atol": 1e-6}


def test_masks_partition_the_causal_triangle():
    exact, linear = sliding_window_masks(9, 3, 2)
    assert not (exact & linear).any()
    assert torch.equal(exact | linear, torch.ones(9, 9).tril().bool())
    assert linear[8].nonzero().flatten().tolist() == [2, 3, 4, 5]  # s = 2 ≤ j ≤ 8 − 3
    assert exact[8].nonzero().flatten().tolist() == [0, 1, 6, 7, 8]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_forward_and_gradients_match_float64_reference(case, layout):
    T, window, sinks, chunk = CASES[case]
    Hq, Hk = LAYOUTS[layout]
    inputs = [x.double().requires_grad_() for x in _inputs(2, Hq, Hk, T)]
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    weight = torch.randn(2, Hq, T, 5, dtype=torch.float64)
    out = _run(*inputs, window=window, sink_tokens=sinks, chunk_size=chunk)
    ref = naive_sliding_window_attention(*ref_inputs[:5], window=window, sink_tokens=sinks, log_mix=ref_inputs[5])
    torch.testing.assert_close(out, ref, **TOL)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for name, a, b in zip(["q", "k", "v", "log_phi_q", "log_phi_k", "log_mix"], inputs, ref_inputs):
        grad = a.grad if a.grad is not None else torch.zeros_like(a)  # no far key at all: no gradient path
        torch.testing.assert_close(grad, b.grad, **TOL, msg=lambda m, n=name: f"grad {n}: {m}")


def test_float32_matches_reference_with_large_logits():
    # Logits up to ~±100 and log-features of either sign: every part is stabilised, nothing overflows.
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 80, q_scale=12.0, seed=3)
    lq, lk = lq * 20, lk * 20
    out = _run(q, k, v, lq, lk, mix, window=9, sink_tokens=2, chunk_size=16)
    ref = naive_sliding_window_attention(q, k, v, lq, lk, window=9, sink_tokens=2, log_mix=mix)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-4, atol=1e-4)


def test_window_and_sinks_without_linear_term():
    q, k, v, *_ = _inputs(2, 4, 2, 40, seed=4)
    out, state = sliding_window_linear_attention(
        q.double(), k.double(), v.double(), None, None, window=6, sink_tokens=3
    )
    ref = naive_sliding_window_attention(q.double(), k.double(), v.double(), None, None, window=6, sink_tokens=3)
    torch.testing.assert_close(out, ref, **TOL)
    assert state.linear is None and state.log_phi_k is None


def test_window_covering_everything_is_softmax_attention():
    q, k, v, lq, lk, mix = _inputs(1, 2, 2, 30, seed=5)
    out = _run(q.double(), k.double(), v.double(), lq.double(), lk.double(), mix.double(), window=30)
    logits = (q.double() @ k.double().transpose(-1, -2) / 8**0.5).masked_fill(
        torch.ones(30, 30).triu(1).bool(), -torch.inf
    )
    torch.testing.assert_close(out, logits.softmax(-1) @ v.double(), **TOL)


def test_very_negative_mix_turns_the_far_term_off():
    q, k, v, lq, lk, _ = _inputs(1, 2, 1, 33, seed=6)
    off = torch.full((2,), -1e4)
    out = _run(q.double(), k.double(), v.double(), lq.double(), lk.double(), off.double(), window=4, sink_tokens=1)
    alone = sliding_window_linear_attention(q.double(), k.double(), v.double(), None, None, window=4, sink_tokens=1)[0]
    torch.testing.assert_close(out, alone, **TOL)


@pytest.mark.parametrize("left_pad", [0, 3])
def test_padding_keys_are_never_attended(left_pad):
    B, T = 2, 29
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(B, 4, 2, T, seed=7))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :left_pad] = False  # left padding of the second sequence
    mask[0, 11] = False  # a hole in the first
    out = _run(q, k, v, lq, lk, mix, window=5, sink_tokens=2, key_padding_mask=mask, chunk_size=8)
    ref = naive_sliding_window_attention(q, k, v, lq, lk, window=5, sink_tokens=2, log_mix=mix, key_padding_mask=mask)
    rows = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[rows], ref[rows], **TOL)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "splits", [[1] * 30, [7, 1, 1, 12, 1, 8], [3, 27], [20, 10]], ids=["decode", "mixed", "3+27", "20+10"]
)
@pytest.mark.parametrize("sinks", [0, 4])
def test_prefill_then_decode_equals_one_pass(splits, sinks):
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 4, 2, 30, seed=8))
    full = _run(q, k, v, lq, lk, mix, window=6, sink_tokens=sinks, chunk_size=8)
    state, outs, start = None, [], 0
    for n in splits:
        part = slice(start, start + n)
        y, state = sliding_window_linear_attention(q[:, :, part], k[:, :, part], v[:, :, part], lq[:, :, part],
                                                   lk[:, :, part], window=6, sink_tokens=sinks, log_mix=mix,
                                                   state=state, chunk_size=8)  # fmt: skip  # packed args
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)
    assert state.seen == 30 and state.keys.shape[2] == 6 and state.sink_keys.shape[2] == sinks


def test_decode_memory_is_constant_in_the_context_length():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 200, seed=9)
    _, state = sliding_window_linear_attention(
        q[:, :, :16], k[:, :, :16], v[:, :, :16], lq[:, :, :16], lk[:, :, :16], window=8, sink_tokens=2, log_mix=mix
    )
    sizes = set()
    for t in range(16, 200):
        one = slice(t, t + 1)
        _, state = sliding_window_linear_attention(q[:, :, one], k[:, :, one], v[:, :, one], lq[:, :, one],
                                                   lk[:, :, one], window=8, sink_tokens=2, log_mix=mix,
                                                   state=state)  # fmt: skip  # packed args
        sizes.add(state.nbytes)
    assert len(sizes) == 1


def test_state_batch_operations():
    q, k, v, lq, lk, mix = _inputs(3, 2, 2, 12, seed=10)
    _, state = sliding_window_linear_attention(q, k, v, lq, lk, window=4, sink_tokens=1, log_mix=mix)
    picked = state.index_select(0, torch.tensor([2, 0]))
    assert torch.equal(picked.keys[0], state.keys[2]) and torch.equal(picked.linear.kv[1], state.linear.kv[0])
    assert state.repeat_interleave(2).keys.shape[0] == 6


def test_bad_arguments_are_named():
    q, k, v, lq, lk, _ = _inputs(1, 2, 2, 5)
    with pytest.raises(ValueError, match="window"):
        sliding_window_linear_attention(q, k, v, lq, lk, window=0)
    with pytest.raises(ValueError, match="sink_tokens"):
        sliding_window_linear_attention(q, k, v, lq, lk, window=2, sink_tokens=-1)
    with pytest.raises(ValueError, match="both log_phi_q and log_phi_k"):
        sliding_window_linear_attention(q, k, v, lq, None, window=2)
    with pytest.raises(ValueError, match="multiple of Hk"):
        sliding_window_linear_attention(q, k[:, :1].expand(1, 3, 5, 8), v, lq, lk, window=2)


def test_autocast_and_half_inputs_compute_in_float32():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 40, seed=11)
    plain = _run(q, k, v, lq, lk, mix, window=6, sink_tokens=2, chunk_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = _run(q, k, v, lq, lk, mix, window=6, sink_tokens=2, chunk_size=8)
    torch.testing.assert_close(autocast, plain, rtol=1e-6, atol=1e-6)
    half = _run(*(x.bfloat16() for x in (q, k, v, lq, lk, mix)), window=6, sink_tokens=2, chunk_size=8)
    upcast = _run(*(x.bfloat16().float() for x in (q, k, v, lq, lk, mix)), window=6, sink_tokens=2, chunk_size=8)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half, upcast.bfloat16(), rtol=0, atol=0)
