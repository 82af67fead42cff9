"""A decay per feature of the far term (``far_decay`` ``(Hk, M)``; the layer's ``far_decay_spread``): the kernel
against the float64 reference over several of the kernel's segments, chunked prefill and decoding equal to one pass,
per-feature rates that are equal being the per-head decay, the layer's cap and options, and students that generate,
save and load with it. Forward and gradients on short inputs, the layer's log-spaced start against the reference and
the windowed layer loss: tests/attention/test_far_decay.py, parametrised per head and per feature."""

from __future__ import annotations

import math

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from lit_dof.students import linearize, load_student
from tests.attention.test_sliding_window import TOL, _inputs
from tests.conftest import tiny_model
from tests.students.test_generation import greedy_by_reforward


def _rates(Hk: int, M: int, low: float, high: float, seed: int = 0) -> torch.Tensor:
    """``(Hk, M)`` float64 rates drawn log-uniformly in [low, high] nats per token."""
    g = torch.Generator().manual_seed(seed)
    return torch.exp(math.log(low) + (math.log(high) - math.log(low)) * torch.rand(Hk, M, generator=g)).double()


def _run(q, k, v, lq, lk, mix, rates, **kw):
    return sliding_window_linear_attention(q, k, v, lq, lk, log_mix=mix, far_decay=rates, **kw)


def test_fast_and_slow_features_over_many_segments_stay_exact():
    """Rates from 0.002 to 0.9 nats per token over 700 tokens: the kernel splits the far term into segments
    (``aligned.SPAN``) and re-references the state feature by feature; float32 must still match the reference."""
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 700, seed=6)
    rates = _rates(2, 6, 0.002, 0.9, seed=2)
    out = _run(q, k, v, lq, lk, mix, rates.float(), window=8, sink_tokens=2, chunk_size=32)[0]
    ref = naive_sliding_window_attention(
        q.double(), k.double(), v.double(), lq.double(), lk.double(), window=8, sink_tokens=2, log_mix=mix.double(),
        far_decay=rates,
    )  # fmt: skip
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("splits", [[1] * 30, [7, 1, 1, 12, 1, 8]], ids=["decode", "mixed"])
def test_prefill_then_decode_equals_one_pass(splits):
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 4, 2, 30, seed=2))
    rates = _rates(2, 6, 0.02, 0.6, seed=3)
    full = _run(q, k, v, lq, lk, mix, rates, window=6, sink_tokens=3, chunk_size=8)[0]
    state, outs, start = None, [], 0
    for n in splits:
        part = slice(start, start + n)
        y, state = _run(q[:, :, part], k[:, :, part], v[:, :, part], lq[:, :, part], lk[:, :, part], mix, rates,
                        window=6, sink_tokens=3, state=state, chunk_size=8)  # fmt: skip  # packed args
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)


def test_equal_rates_in_every_feature_are_the_decay_per_head():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 45, seed=7)
    per_head = torch.tensor([0.05, 0.3])
    head = _run(q, k, v, lq, lk, mix, per_head, window=5, sink_tokens=1, chunk_size=8)[0]
    feature = _run(q, k, v, lq, lk, mix, per_head[:, None].expand(2, 6), window=5, sink_tokens=1, chunk_size=8)[0]
    torch.testing.assert_close(feature, head, rtol=1e-6, atol=1e-7)


def test_the_kernel_names_what_a_decay_per_feature_does_not_go_with():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 9)
    with pytest.raises(ValueError, match=r"far_decay must have shape \(Hk,\) or \(Hk, M\)"):
        _run(q, k, v, lq, lk, mix, torch.zeros(2, 5), window=2)
    with pytest.raises(ValueError, match="additive far term alone"):
        _run(q, k, v, lq, lk, mix, torch.zeros(2, 6), window=2, far_log_gates=torch.zeros(1, 2, 9))


def test_a_rate_is_capped_at_one_over_gate_min_decay_and_printed_as_a_range():
    fm = LearnedPRF(8, 2, 5, seed=1)
    options = SlidingWindow(window=5, sink_tokens=2, far_decay=16.0, far_decay_spread=16.0, learn_decay=True)
    layer = SlidingWindowLinearAttention(fm, 4, 2, sliding_window=options)
    assert "far_decay=per feature, 16-256 tokens" in repr(layer)
    with torch.no_grad():  # the fastest a feature may forget: 1/gate_min_decay (16 tokens by default)
        layer.far_log_decay.fill_(5.0)
    torch.testing.assert_close(layer.decay_rates(), torch.full((2, 5), 1 / 16))
    assert "far_decay=per feature, 16-16 tokens" in repr(layer)


def test_options_refuse_a_spread_without_its_decay_or_beside_a_gate_or_cache_or_the_fla_kernel():
    with pytest.raises(ValueError, match="far_decay_spread must be a number >= 1"):
        SlidingWindow(window=3, far_decay=8.0, far_decay_spread=0.5)
    with pytest.raises(ValueError, match="far_decay_spread needs far_decay"):
        SlidingWindow(window=3, far_decay_spread=4.0)
    with pytest.raises(ValueError, match=r"far_decay \(8.0\) must be at least gate_min_decay \(16.0\)"):
        SlidingWindow(window=3, far_decay=8.0, far_decay_spread=4.0)
    for extra in ({"far_gate": True}, {"far_cache": 4}, {"far_memory": "delta"}):
        with pytest.raises(ValueError, match="additive far term alone"):
            SlidingWindow(window=3, far_decay=64.0, far_decay_spread=4.0, **extra)
    options = SlidingWindow(window=3, far_decay=64.0, far_decay_spread=4.0)
    with pytest.raises(ValueError, match="a decay per feature .* runs on linear_kernel 'torch'"):
        SlidingWindowLinearAttention(LearnedPRF(8, 2, 4), 4, 2, sliding_window=options, linear_kernel="fla")
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 9)  # the kernel itself, called directly
    with pytest.raises(ValueError, match="one gate per head"):
        _run(q, k, v, lq, lk, mix, torch.full((2, 6), 0.1), window=2, linear_kernel="fla")


def test_student_generates_like_reforward_and_round_trips(tmp_path):
    options = SlidingWindow(
        window=4, sink_tokens=1, far_decay=3.0, far_decay_spread=10.0, learn_decay=True, gate_min_decay=2.0
    )
    student = linearize(tiny_model("llama"), LearnedPRF, 12, sliding_window=options)
    with torch.no_grad():
        for twin in student.linear_modules().values():
            twin.far_log_decay.add_(0.3 * torch.randn(twin.far_log_decay.shape))
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    out = student.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 20), rtol=0, atol=0)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert loaded.config.window_options["far_decay_spread"] == 10.0
    for i, twin in student.linear_modules().items():
        assert twin.far_log_decay.shape == (twin.feature_map.num_heads, 12)
        torch.testing.assert_close(loaded.linear_modules()[i].far_log_decay, twin.far_log_decay)
    with torch.no_grad():
        torch.testing.assert_close(loaded(out).logits, student(out).logits)
