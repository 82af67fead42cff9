"""The far term's decay past the window (``far_decay``), per head and per feature (``far_decay_spread``): the
kernel against the float64 reference (forward and gradients, the decay rates' included), chunked prefill and
decoding equal to one pass, decays large enough to force the kernel's finer stabilisers, the bounded reach that
makes a long context look like a short one, the layer against the reference, the layer's options, the windowed layer
loss, and students that generate, save and load with it."""

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

CASES = {  # (T, window, sinks, chunk, rates per KV head)
    "T37-w5-C8": (37, 5, 0, 8, (0.05, 0.3)),
    "T50-w1-s1-C16": (50, 1, 1, 16, (0.0, 0.12)),
    "T67-w16-s4-C16": (67, 16, 4, 16, (0.02, 0.3)),
    "T20-w100-s2-C8": (20, 100, 2, 8, (0.1, 0.1)),  # no far key at all
}


def _run(q, k, v, lq, lk, mix, rates, **kw):
    return sliding_window_linear_attention(q, k, v, lq, lk, log_mix=mix, far_decay=rates, **kw)


@pytest.mark.parametrize("per_feature", [False, True], ids=["per-head", "per-feature"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_forward_and_gradients_match_float64_reference(case, layout, seed, per_feature):
    """Per KV head, or per feature (``far_decay`` ``(Hk, M)``: the head's rate scaled from 0.3 to 1.7 over its 6
    features)."""
    T, window, sinks, chunk, rates = CASES[case]
    Hq, Hk = layout
    inputs = [x.double().requires_grad_() for x in _inputs(2, Hq, Hk, T, seed=seed)]
    rates = torch.tensor(rates, dtype=torch.float64)
    rates = rates[:, None] * torch.linspace(0.3, 1.7, 6, dtype=torch.float64) if per_feature else rates
    inputs.append(rates.requires_grad_())
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    weight = torch.randn(2, Hq, T, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    out = _run(*inputs, window=window, sink_tokens=sinks, chunk_size=chunk)[0]
    q, k, v, lq, lk, mix, lam = ref_inputs
    ref = naive_sliding_window_attention(q, k, v, lq, lk, window=window, sink_tokens=sinks, log_mix=mix, far_decay=lam)
    torch.testing.assert_close(out, ref, **TOL)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for name, a, b in zip(["q", "k", "v", "log_phi_q", "log_phi_k", "log_mix", "far_decay"], inputs, ref_inputs):
        grad = a.grad if a.grad is not None else torch.zeros_like(a)  # no far key at all: no gradient path
        # λ's gradient sums distance-weighted terms over every far pair in float32: its rounding is larger
        tol = {"rtol": 1e-4, "atol": 1e-5} if name == "far_decay" else TOL
        torch.testing.assert_close(grad, b.grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")


def test_zero_decay_is_no_decay():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 41, seed=1)
    plain = sliding_window_linear_attention(q, k, v, lq, lk, log_mix=mix, window=6, sink_tokens=2, chunk_size=8)[0]
    zero = _run(q, k, v, lq, lk, mix, torch.zeros(2), window=6, sink_tokens=2, chunk_size=8)[0]
    torch.testing.assert_close(zero, plain, rtol=0, atol=0)


@pytest.mark.parametrize("splits", [[1] * 30, [7, 1, 1, 12, 1, 8], [20, 10]], ids=["decode", "mixed", "20+10"])
@pytest.mark.parametrize("sinks", [0, 3])
def test_prefill_then_decode_equals_one_pass(splits, sinks):
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 4, 2, 30, seed=2))
    rates = torch.tensor([0.07, 0.4], dtype=torch.float64)
    full = _run(q, k, v, lq, lk, mix, rates, window=6, sink_tokens=sinks, chunk_size=8)[0]
    state, outs, start = None, [], 0
    for n in splits:
        part = slice(start, start + n)
        y, state = _run(q[:, :, part], k[:, :, part], v[:, :, part], lq[:, :, part], lk[:, :, part], mix, rates,
                        window=6, sink_tokens=sinks, state=state, chunk_size=8)  # fmt: skip  # packed args
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)


def test_decays_beyond_the_stabilisers_range_stay_exact():
    # λ = 3 nats per token over 200 tokens: key offsets span 600 nats inside one block of the linear kernel,
    # which has to fall back to its finer stabilisers; the result must still equal the reference.
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 2, 2, 200, seed=3))
    rates = torch.tensor([3.0, 0.5], dtype=torch.float64)
    out = _run(q, k, v, lq, lk, mix, rates, window=4, chunk_size=16)[0]
    ref = naive_sliding_window_attention(q, k, v, lq, lk, window=4, log_mix=mix, far_decay=rates)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **TOL)


def test_the_far_term_reaches_about_one_over_lambda_past_the_window():
    # With λ = 0.5 a key 70 tokens past the window weighs e^-35 of one at the window's edge: the last query of
    # a 300-token context equals the same query given only its last 80 tokens (no sinks: nothing else is exact).
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 4, 2, 300, seed=4))
    rates = torch.tensor([0.5, 0.5], dtype=torch.float64)
    full = _run(q, k, v, lq, lk, mix, rates, window=10, chunk_size=16)[0]
    tail = _run(*(x[:, :, -80:] for x in (q, k, v, lq, lk)), mix, rates, window=10, chunk_size=16)[0]
    torch.testing.assert_close(full[:, :, -1], tail[:, :, -1], **TOL)
    undecayed = _run(q, k, v, lq, lk, mix, None, window=10, chunk_size=16)[0]  # without it, far keys count
    assert (undecayed[:, :, -1] - tail[:, :, -1]).abs().max() > 1e-3


def test_bad_decay_shape_is_named():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 5)
    with pytest.raises(ValueError, match="far_decay must have shape"):
        _run(q, k, v, lq, lk, mix, torch.zeros(4), window=2)


@pytest.mark.parametrize("share_kv_maps", [True, False], ids=["shared", "per-query-head"])
@pytest.mark.parametrize("learn_decay", [False, True], ids=["fixed", "learned"])
@pytest.mark.parametrize("spread", [None, 16.0], ids=["per-head", "per-feature"])
def test_layer_matches_reference_and_trains_its_rates_only_when_asked(share_kv_maps, learn_decay, spread):
    """One rate per head at 1/far_decay, or (``far_decay_spread``) one per feature, τ log-spaced from far_decay to
    spread × far_decay."""
    torch.manual_seed(0)
    Hq, Hk, d, T = 4, 2, 8, 31
    fm = LearnedPRF(d, Hk if share_kv_maps else Hq, 5, seed=1)
    options = SlidingWindow(window=5, sink_tokens=2, far_decay=16.0, learn_decay=learn_decay, far_decay_spread=spread)
    layer = SlidingWindowLinearAttention(fm, Hq, Hk, sliding_window=options)
    tau = (
        torch.tensor([16.0, 32.0, 64.0, 128.0, 256.0]).expand(fm.num_heads, 5)
        if spread
        else torch.full((fm.num_heads,), 16.0)
    )
    torch.testing.assert_close(layer.decay_rates(), 1 / tau)
    assert ("far_log_decay" in dict(layer.named_parameters())) == learn_decay
    assert "far_log_decay" in layer.state_dict()
    q, k, v = torch.randn(1, Hq, T, d), torch.randn(1, Hk, T, d), torch.randn(1, Hk, T, 3)
    y, _ = layer(q, k, v)
    kk, vv = (k, v) if share_kv_maps else (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    lq, lk = layer.exact_log_features(q, k)
    ref = naive_sliding_window_attention(
        q, kk, vv, lq, lk, window=5, sink_tokens=2, log_mix=layer.log_mix, far_decay=layer.decay_rates()
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert layer.decay_rates(per_query_head=True).shape == (Hq, *tau.shape[1:])
    if learn_decay:
        y.square().sum().backward()
        assert (layer.far_log_decay.grad != 0).all()  # every rate (per head, or per feature) has its gradient


def test_layer_refuses_bad_decay_options():
    with pytest.raises(ValueError, match="far_decay must be a positive"):
        SlidingWindowLinearAttention(LearnedPRF(8, 2, 4), 4, 2, sliding_window=SlidingWindow(window=3, far_decay=0))
    with pytest.raises(ValueError, match="learn_decay needs far_decay"):
        SlidingWindowLinearAttention(
            LearnedPRF(8, 2, 4), 4, 2, sliding_window=SlidingWindow(window=3, learn_decay=True)
        )
    with pytest.raises(ValueError, match="need a sliding window"):
        linearize(tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(far_decay=64))


@pytest.mark.parametrize("spread", [None, 8.0], ids=["per-head", "per-feature"])
def test_windowed_softmax_loss_includes_the_decay(spread):
    """KL(teacher row ‖ twin row) with the twin's row read off the float64 reference with one-hot values; with a
    decay per feature (``far_decay_spread``) every feature's rate gets its own gradient."""
    torch.manual_seed(4)
    fm = LearnedPRF(8, 2, 16, seed=4)
    options = SlidingWindow(
        window=3, sink_tokens=1, far_decay=4.0, learn_decay=True, far_decay_spread=spread, gate_min_decay=1.0
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
    assert (twin.far_log_decay.grad != 0).all()


@pytest.mark.parametrize("learn_decay", [False, True], ids=["fixed", "learned"])
def test_student_generates_like_reforward_and_round_trips(tmp_path, learn_decay):
    options = SlidingWindow(window=4, sink_tokens=1, far_decay=6.0, learn_decay=learn_decay)
    student = linearize(tiny_model("llama"), LearnedPRF, 12, sliding_window=options)
    with torch.no_grad():
        for twin in student.linear_modules().values():
            twin.far_log_decay.add_(torch.randn(twin.far_log_decay.shape))
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    out = student.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 20), rtol=0, atol=0)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    options = loaded.config.window_options
    assert (options["far_decay"], options["learn_decay"]) == (6.0, learn_decay)
    for i, twin in student.linear_modules().items():
        torch.testing.assert_close(loaded.linear_modules()[i].far_log_decay, twin.far_log_decay)
    with torch.no_grad():
        torch.testing.assert_close(loaded(out).logits, student(out).logits)
