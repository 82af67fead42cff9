"""A decay per feature of the far term (``far_decay`` ``(Hk, M)``; the layer's ``far_decay_spread``): the kernel
against the float64 reference (forward and gradients, the rates' included), over several of the kernel's segments,
chunked prefill and decoding equal to one pass, per-feature rates that are equal being the per-head decay, the
layer's log-spaced start and options, the windowed layer loss, and students that generate, save and load with it."""

from __future__ import annotations

import math

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from lit_dof.students import linearize, load_student
from lit_dof.students.losses import attention_distillation_loss
from tests.attention.test_sliding_window import TOL, _inputs
from tests.conftest import tiny_model
from tests.students.test_generation import greedy_by_reforward


def _rates(Hk: int, M: int, low: float, high: float, seed: int = 0) -> torch.Tensor:
    """``(Hk, M)`` float64 rates drawn log-uniformly in [low, high] nats per token."""
    g = torch.Generator().manual_seed(seed)
    return torch.exp(math.log(low) + (math.log(high) - math.log(low)) * torch.rand(Hk, M, generator=g)).double()


def _run(q, k, v, lq, lk, mix, rates, **kw):
    return sliding_window_linear_attention(q, k, v, lq, lk, log_mix=mix, far_decay=rates, **kw)


@pytest.mark.parametrize("case", [(37, 5, 0, 8), (67, 16, 4, 16), (20, 100, 2, 8)], ids=["w5", "w16-s4", "no-far"])
@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_forward_and_gradients_match_float64_reference(case, layout):
    T, window, sinks, chunk = case
    Hq, Hk = layout
    inputs = [x.double().requires_grad_() for x in _inputs(2, Hq, Hk, T, seed=5)]
    inputs.append(_rates(Hk, 6, 0.01, 0.5).requires_grad_())
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    weight = torch.randn(2, Hq, T, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = _run(*inputs, window=window, sink_tokens=sinks, chunk_size=chunk)[0]
    q, k, v, lq, lk, mix, lam = ref_inputs
    ref = naive_sliding_window_attention(q, k, v, lq, lk, window=window, sink_tokens=sinks, log_mix=mix, far_decay=lam)
    torch.testing.assert_close(out, ref, **TOL)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for name, a, b in zip(["q", "k", "v", "log_phi_q", "log_phi_k", "log_mix", "far_decay"], inputs, ref_inputs):
        grad = a.grad if a.grad is not None else torch.zeros_like(a)  # no far key at all: no gradient path
        tol = {"rtol": 1e-4, "atol": 1e-5} if name == "far_decay" else TOL
        torch.testing.assert_close(grad, b.grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")


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


@pytest.mark.parametrize("share_kv_maps", [True, False], ids=["shared", "per-query-head"])
def test_layer_starts_log_spaced_matches_the_reference_and_learns_each_rate(share_kv_maps):
    torch.manual_seed(0)
    Hq, Hk, d, T, M = 4, 2, 8, 31, 5
    fm = LearnedPRF(d, Hk if share_kv_maps else Hq, M, seed=1)
    options = SlidingWindow(window=5, sink_tokens=2, far_decay=16.0, far_decay_spread=16.0, learn_decay=True)
    layer = SlidingWindowLinearAttention(fm, Hq, Hk, sliding_window=options)
    tau = torch.tensor([16.0, 32.0, 64.0, 128.0, 256.0])  # log-spaced from far_decay to 16 × far_decay
    torch.testing.assert_close(layer.decay_rates(), (1 / tau).expand(fm.num_heads, M))
    assert layer.decay_rates(per_query_head=True).shape == (Hq, M)
    q, k, v = torch.randn(1, Hq, T, d), torch.randn(1, Hk, T, d), torch.randn(1, Hk, T, 3)
    y, _ = layer(q, k, v)
    kk, vv = (k, v) if share_kv_maps else (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    lq, lk = layer.exact_log_features(q, k)
    ref = naive_sliding_window_attention(
        q, kk, vv, lq, lk, window=5, sink_tokens=2, log_mix=layer.log_mix, far_decay=layer.decay_rates()
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    y.square().sum().backward()
    assert (layer.far_log_decay.grad != 0).all()  # every feature's rate has its own gradient
    with torch.no_grad():  # the fastest a feature may forget: 1/gate_min_decay (16 tokens by default)
        layer.far_log_decay.fill_(5.0)
    torch.testing.assert_close(layer.decay_rates(), torch.full((fm.num_heads, M), 1 / 16))
    assert "far_decay=per feature, 16-16 tokens" in repr(layer)


def test_options_refuse_a_spread_without_its_decay_or_beside_a_gate_or_cache():
    with pytest.raises(ValueError, match="far_decay_spread must be a number >= 1"):
        SlidingWindow(window=3, far_decay=8.0, far_decay_spread=0.5)
    with pytest.raises(ValueError, match="far_decay_spread needs far_decay"):
        SlidingWindow(window=3, far_decay_spread=4.0)
    with pytest.raises(ValueError, match=r"far_decay \(8.0\) must be at least gate_min_decay \(16.0\)"):
        SlidingWindow(window=3, far_decay=8.0, far_decay_spread=4.0)
    for extra in ({"far_gate": True}, {"far_cache": 4}, {"far_memory": "delta"}):
        with pytest.raises(ValueError, match="additive far term alone"):
            SlidingWindow(window=3, far_decay=64.0, far_decay_spread=4.0, **extra)


def test_windowed_softmax_loss_includes_the_decay_per_feature():
    """KL(teacher row ‖ twin row) with the twin's row read off the float64 reference with one-hot values."""
    torch.manual_seed(4)
    fm = LearnedPRF(8, 2, 16, seed=4)
    options = SlidingWindow(
        window=3, sink_tokens=1, far_decay=2.0, far_decay_spread=8.0, learn_decay=True, gate_min_decay=1.0
    )
    twin = SlidingWindowLinearAttention(fm, 4, 2, sliding_window=options)
    B, T = 2, 12
    q, k = 1.5 * torch.randn(B, 4, T, 8), 1.5 * torch.randn(B, 2, T, 8)
    loss = attention_distillation_loss(twin, q, k, None, kind="softmax")
    onehot = torch.eye(T, dtype=torch.float64).expand(B, 2, T, T)
    lq, lk = twin.exact_log_features(q, k)
    mix, rates = twin.log_mix.detach(), twin.decay_rates().detach()
    p_hat = naive_sliding_window_attention(
        q.double(), k.double(), onehot, lq, lk, window=3, sink_tokens=1, log_mix=mix, far_decay=rates
    )
    logits = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)
    causal = torch.ones(T, T).tril().bool()
    p = logits.masked_fill(~causal, -torch.inf).softmax(-1)
    kl = torch.where(causal, p * (p.clamp_min(1e-300).log() - p_hat.clamp_min(1e-300).log()), 0).sum(-1)
    torch.testing.assert_close(loss.double(), kl.mean(), rtol=1e-4, atol=1e-6)
    loss.backward()
    assert (twin.far_log_decay.grad != 0).sum() > twin.far_log_decay.shape[0]  # more than one rate per head moves


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
