"""The far memory's data-dependent forget gate (``far_gate``): the kernel with a gate per head and token against the
float64 reference (forward and gradients, the gates' included), a constant gate equal to the fixed decay, chunked
prefill and decoding equal to one pass, gates fast enough to force the kernel's short segments and finer
stabilisers, the layer (starting exactly at the fixed decay, its gate reading the values), the windowed layer loss
with the gate, the options' errors, and students that generate, save and load with it."""

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

CASES = {  # (T, window, sinks, chunk, largest gate rate in nats per token)
    "T37-w5-C8": (37, 5, 0, 8, 0.3),
    "T50-w1-s1-C16": (50, 1, 1, 16, 0.1),
    "T67-w16-s4-C16": (67, 16, 4, 16, 0.5),
    "T90-w4-C8-fast": (90, 4, 0, 8, 3.0),  # offsets beyond the stabilisers' range: short segments, finer stabilisers
    "T20-w100-s2-C8": (20, 100, 2, 8, 0.1),  # no far key at all
}


def _gates(B, Hk, T, rate, seed):
    return -rate * torch.rand(B, Hk, T, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_forward_and_gradients_match_float64_reference(case, layout, seed):
    T, window, sinks, chunk, rate = CASES[case]
    Hq, Hk = layout
    inputs = [x.double().requires_grad_() for x in _inputs(2, Hq, Hk, T, seed=seed)]
    inputs.append(_gates(2, Hk, T, rate, seed).requires_grad_())
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    weight = torch.randn(2, Hq, T, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    q, k, v, lq, lk, mix, gates = inputs
    out = sliding_window_linear_attention(
        q, k, v, lq, lk, log_mix=mix, far_log_gates=gates, window=window, sink_tokens=sinks, chunk_size=chunk
    )[0]
    q, k, v, lq, lk, mix, gates = ref_inputs
    ref = naive_sliding_window_attention(
        q, k, v, lq, lk, window=window, sink_tokens=sinks, log_mix=mix, far_log_gates=gates
    )
    torch.testing.assert_close(out, ref, **TOL)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    for name, a, b in zip(["q", "k", "v", "log_phi_q", "log_phi_k", "log_mix", "gates"], inputs, ref_inputs):
        grad = a.grad if a.grad is not None else torch.zeros_like(a)  # no far key at all: no gradient path
        tol = {"rtol": 1e-4, "atol": 1e-5} if name == "gates" else TOL  # sums over far pairs in float32
        torch.testing.assert_close(grad, b.grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")


def test_a_constant_gate_is_the_fixed_decay_and_gates_add_to_it():
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(2, 4, 2, 45, seed=5))
    rates = torch.tensor([0.07, 0.3], dtype=torch.float64)
    kw = {"window": 6, "sink_tokens": 2, "log_mix": mix}
    decayed = sliding_window_linear_attention(q, k, v, lq, lk, far_decay=rates, chunk_size=8, **kw)[0]
    constant = -rates[None, :, None].expand(2, 2, 45)
    gated = sliding_window_linear_attention(q, k, v, lq, lk, far_log_gates=constant, chunk_size=8, **kw)
    torch.testing.assert_close(gated[0], decayed, **TOL)
    gates = _gates(2, 2, 45, 0.2, 5)
    both = sliding_window_linear_attention(q, k, v, lq, lk, far_decay=rates, far_log_gates=gates, chunk_size=8, **kw)
    ref = naive_sliding_window_attention(q, k, v, lq, lk, far_log_gates=gates - rates[None, :, None], **kw)
    torch.testing.assert_close(both[0], ref, **TOL)


@pytest.mark.parametrize("splits", [[1] * 30, [7, 1, 1, 12, 1, 8], [20, 10]], ids=["decode", "mixed", "20+10"])
@pytest.mark.parametrize("sinks", [0, 3])
def test_prefill_then_decode_equals_one_pass(splits, sinks):
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 4, 2, 30, seed=2))
    gates = _gates(1, 2, 30, 0.4, 2)
    kw = {"window": 6, "sink_tokens": sinks, "chunk_size": 8, "log_mix": mix}
    full = sliding_window_linear_attention(q, k, v, lq, lk, far_log_gates=gates, **kw)[0]
    state, outs, start = None, [], 0
    for n in splits:
        part = slice(start, start + n)
        q_p, k_p, v_p, lq_p, lk_p, g_p = (x[:, :, part] for x in (q, k, v, lq, lk, gates))
        y, state = sliding_window_linear_attention(q_p, k_p, v_p, lq_p, lk_p, far_log_gates=g_p, state=state, **kw)
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)


def test_bad_gate_shape_is_named():
    q, k, v, lq, lk, mix = _inputs(1, 4, 2, 5)
    with pytest.raises(ValueError, match=r"far_log_gates must have shape \(B, Hk, T\)"):
        sliding_window_linear_attention(q, k, v, lq, lk, far_log_gates=torch.zeros(1, 4, 5), window=2)


def _gated_layer(share_kv_maps=True, **options):
    fm = LearnedPRF(8, 2 if share_kv_maps else 4, 6, seed=1)
    window = SlidingWindow(window=5, sink_tokens=2, far_decay=40.0, far_gate=True, **options)
    return SlidingWindowLinearAttention(fm, 4, 2, sliding_window=window)


@pytest.mark.parametrize("share_kv_maps", [True, False], ids=["shared", "per-query-head"])
def test_layer_starts_at_the_fixed_decay_and_matches_the_reference_once_its_gate_moves(share_kv_maps):
    torch.manual_seed(0)
    layer = _gated_layer(share_kv_maps)
    fm, T = layer.feature_map, 31
    fixed = SlidingWindowLinearAttention(
        fm, 4, 2, sliding_window=SlidingWindow(window=5, sink_tokens=2, far_decay=40.0)
    )
    q, k, v = torch.randn(1, 4, T, 8), torch.randn(1, 2, T, 8), torch.randn(1, 2, T, 8)
    torch.testing.assert_close(layer(q, k, v)[0], fixed(q, k, v)[0], rtol=1e-5, atol=1e-6)  # w = 0: rate 1/40
    with torch.no_grad():
        layer.far_gate_weight.normal_(0, 2.0)
    y, _ = layer(q, k, v)
    kk, vv = (k, v) if share_kv_maps else (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    gates = layer.far_log_gates(vv)
    assert gates.shape == (1, fm.num_heads, T) and (gates < 0).all() and (gates > -1 / 16).all()
    assert gates.std() > 1e-3  # data-dependent once w moved
    lq, lk = layer.exact_log_features(q, k)
    ref = naive_sliding_window_attention(
        q, kk, vv, lq, lk, window=5, sink_tokens=2, log_mix=layer.log_mix, far_log_gates=gates
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert layer.far_log_gates(vv, per_query_head=True).shape == (1, 4, T)
    assert layer.far_gated and layer.decay_rates() is None and "far_gate=True" in repr(layer)


def test_windowed_softmax_loss_includes_the_gate_and_trains_it():
    """KL(teacher row ‖ twin row) with the twin's row read off the float64 reference with one-hot values."""
    torch.manual_seed(4)
    twin = _gated_layer()
    with torch.no_grad():
        twin.far_gate_weight.normal_(0, 2.0)
    B, T = 2, 12
    q, k, v = 1.5 * torch.randn(B, 4, T, 8), 1.5 * torch.randn(B, 2, T, 8), torch.randn(B, 2, T, 8)
    with pytest.raises(ValueError, match="forget gate that reads the values"):
        attention_distillation_loss(twin, q, k, None, kind="softmax")
    loss = attention_distillation_loss(twin, q, k, None, kind="softmax", values=v)
    onehot = torch.eye(T, dtype=torch.float64).expand(B, 2, T, T)
    lq, lk = twin.exact_log_features(q, k)
    gates = twin.far_log_gates(v).detach()
    p_hat = naive_sliding_window_attention(
        q.double(),
        k.double(),
        onehot,
        lq,
        lk,
        window=5,
        sink_tokens=2,
        log_mix=twin.log_mix.detach(),
        far_log_gates=gates,
    )
    logits = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)
    causal = torch.ones(T, T).tril().bool()
    p = logits.masked_fill(~causal, -torch.inf).softmax(-1)
    kl = torch.where(causal, p * (p.clamp_min(1e-300).log() - p_hat.clamp_min(1e-300).log()), 0).sum(-1)
    torch.testing.assert_close(loss.double(), kl.mean(), rtol=1e-4, atol=1e-6)
    loss.backward()
    assert twin.far_gate_weight.grad.abs().sum() > 0 and twin.far_gate_bias.grad.abs().sum() > 0


def test_options_refuse_a_gate_without_its_starting_decay_or_with_a_learned_decay():
    with pytest.raises(ValueError, match="far_gate needs far_decay"):
        SlidingWindow(window=3, far_gate=True)
    with pytest.raises(ValueError, match="learns its own decay"):
        SlidingWindow(window=3, far_decay=64, learn_decay=True, far_gate=True)
    with pytest.raises(ValueError, match="must exceed gate_min_decay"):
        SlidingWindow(window=3, far_decay=8, far_gate=True)
    with pytest.raises(ValueError, match="gate_min_decay must be a positive"):
        SlidingWindow(window=3, far_decay=64, far_gate=True, gate_min_decay=0)
    with pytest.raises(ValueError, match="need a sliding window"):
        SlidingWindow(far_gate=True, far_decay=64)
    with pytest.raises(ValueError, match="reads values"):
        _gated_layer().far_log_gates(torch.randn(1, 2, 5, 3))


def check_generation_and_round_trip(student, tmp_path, parameter: str) -> None:
    """``student`` (its twins' ``parameter`` randomised) generates as re-forwarding does, saves and loads with it."""
    with torch.no_grad():
        for twin in student.linear_modules().values():
            getattr(twin, parameter).normal_(0, 3.0)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    out = student.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 20), rtol=0, atol=0)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert loaded.config.window_options == student.config.window_options
    for i, twin in student.linear_modules().items():
        torch.testing.assert_close(getattr(loaded.linear_modules()[i], parameter), getattr(twin, parameter))
    with torch.no_grad():
        torch.testing.assert_close(loaded(out).logits, student(out).logits)


def test_student_generates_like_reforward_and_round_trips(tmp_path):
    options = SlidingWindow(window=4, sink_tokens=1, far_decay=24.0, far_gate=True, gate_min_decay=4.0)
    student = linearize(tiny_model("llama"), LearnedPRF, 12, sliding_window=options)
    assert (student.config.window_options["far_gate"], student.config.window_options["gate_min_decay"]) == (True, 4.0)
    check_generation_and_round_trip(student, tmp_path, "far_gate_weight")
