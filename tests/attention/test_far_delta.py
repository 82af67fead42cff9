"""The delta-rule far memory (``far_memory="delta"``): the combined kernel against the float64 reference (forward and
gradients of every input, the write strengths' and gates' included; GQA, sinks, padding, a window longer than the
sequence), prefill and decoding equal to one pass, the layer and its write strengths, the losses that can and
cannot train it, and students that generate, save and load with it."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from lit_dof.students import linearize
from lit_dof.students.losses import attention_distillation_loss, attention_output_loss
from tests.attention.test_far_gate import check_generation_and_round_trip
from tests.attention.test_sliding_window import TOL, _inputs
from tests.conftest import tiny_model

CASES = {  # (T, window, sinks, chunk)
    "T37-w5-C8": (37, 5, 0, 8),
    "T50-w1-s1-C16": (50, 1, 1, 16),
    "T67-w16-s4-C16": (67, 16, 4, 16),
    "T20-w100-s2-C8": (20, 100, 2, 8),  # no far key at all
}


def _extras(B, Hk, T, seed):
    g = torch.Generator().manual_seed(seed + 50)
    write = torch.rand(B, Hk, T, generator=g, dtype=torch.float64)
    gates = -0.2 * torch.rand(B, Hk, T, generator=g, dtype=torch.float64)
    return write, gates


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "left-padded"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_forward_and_gradients_match_float64_reference(case, layout, padded):
    T, window, sinks, chunk = CASES[case]
    Hq, Hk = layout
    inputs = [x.double().requires_grad_() for x in (*_inputs(2, Hq, Hk, T, seed=1), *_extras(2, Hk, T, 1))]
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    mask = torch.ones(2, T, dtype=torch.bool)
    if padded:
        mask[1, : T // 3] = False
    kw = {"window": window, "sink_tokens": sinks, "key_padding_mask": mask, "far_decay": torch.tensor([0.05, 0.1])}
    q, k, v, lq, lk, mix, write, gates = inputs
    out = sliding_window_linear_attention(
        q, k, v, lq, lk, log_mix=mix, far_write=write, far_log_gates=gates, chunk_size=chunk, **kw
    )[0]
    q, k, v, lq, lk, mix, write, gates = ref_inputs
    ref = naive_sliding_window_attention(q, k, v, lq, lk, log_mix=mix, far_write=write, far_log_gates=gates, **kw)
    rows = mask[:, None, :, None]  # padding queries' rows are meaningless (NaN in the reference)
    torch.testing.assert_close(out.masked_fill(~rows, 0), ref.masked_fill(~rows, 0), **TOL)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (out.masked_fill(~rows, 0) * weight).sum().backward()
    (ref.masked_fill(~rows, 0) * weight).sum().backward()
    for name, a, b in zip(["q", "k", "v", "lq", "lk", "mix", "write", "gates"], inputs, ref_inputs):
        grad = a.grad if a.grad is not None else torch.zeros_like(a)  # no far key at all: no gradient path
        known = torch.isfinite(b.grad)
        torch.testing.assert_close(
            grad[known], b.grad[known], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"grad {n}: {m}"
        )


@pytest.mark.parametrize("splits", [[1] * 30, [7, 1, 1, 12, 1, 8], [20, 10]], ids=["decode", "mixed", "20+10"])
@pytest.mark.parametrize("sinks", [0, 3])
def test_prefill_then_decode_equals_one_pass(splits, sinks):
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(1, 4, 2, 30, seed=2))
    write, gates = _extras(1, 2, 30, 2)
    kw = {"window": 6, "sink_tokens": sinks, "chunk_size": 8, "log_mix": mix}
    full = sliding_window_linear_attention(q, k, v, lq, lk, far_write=write, far_log_gates=gates, **kw)[0]
    state, outs, start = None, [], 0
    for n in splits:
        q_p, k_p, v_p, lq_p, lk_p, w_p, g_p = (x[:, :, start : start + n] for x in (q, k, v, lq, lk, write, gates))
        y, state = sliding_window_linear_attention(
            q_p, k_p, v_p, lq_p, lk_p, far_write=w_p, far_log_gates=g_p, state=state, **kw
        )
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)
    assert state.memory.shape == (1, 2, 6, 5) and state.write.shape == (1, 2, 6)


def test_bad_inputs_are_named():
    q, k, v, lq, lk, _ = _inputs(1, 4, 2, 5)
    with pytest.raises(ValueError, match=r"far_write must have shape \(B, Hk, T\)"):
        sliding_window_linear_attention(q, k, v, lq, lk, far_write=torch.rand(1, 4, 5), window=2)
    with pytest.raises(ValueError, match="far_memory must be 'additive' or 'delta'"):
        SlidingWindow(window=3, far_memory="sum")
    with pytest.raises(ValueError, match="needs the far term"):
        SlidingWindow(window=3, far_term=False, far_memory="delta")


def _delta_layer():
    fm = LearnedPRF(8, 2, 6, seed=1)
    options = SlidingWindow(window=5, sink_tokens=2, far_decay=40.0, far_gate=True, far_memory="delta")
    return SlidingWindowLinearAttention(fm, 4, 2, sliding_window=options)


def test_layer_matches_the_reference_and_only_the_output_loss_trains_it():
    torch.manual_seed(0)
    layer = _delta_layer()
    with torch.no_grad():
        layer.far_write_weight.normal_(0, 2.0)
        layer.far_gate_weight.normal_(0, 2.0)
    T = 31
    q, k, v = torch.randn(1, 4, T, 8), torch.randn(1, 2, T, 8), torch.randn(1, 2, T, 8)
    y, _ = layer(q, k, v)
    lq, lk = layer.exact_log_features(q, k)
    write = layer.far_write_strengths(v)
    assert write.shape == (1, 2, T) and ((write > 0) & (write < 1)).all() and write.std() > 1e-3
    ref = naive_sliding_window_attention(
        q,
        k,
        v,
        lq,
        lk,
        window=5,
        sink_tokens=2,
        log_mix=layer.log_mix,
        far_log_gates=layer.far_log_gates(v),
        far_write=write,
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert layer.far_delta and "far_memory='delta'" in repr(layer)
    with pytest.raises(ValueError, match="no attention rows to distil"):
        attention_distillation_loss(layer, q, k, None, kind="softmax", values=v)
    out = torch.randn(1, T, 4, 8)
    attention_output_loss(layer, q, k, v, out).backward()
    assert layer.far_write_weight.grad.abs().sum() > 0 and layer.far_write_bias.grad.abs().sum() > 0


def test_student_generates_like_reforward_and_round_trips(tmp_path):
    options = SlidingWindow(window=4, sink_tokens=1, far_decay=24.0, far_memory="delta")
    student = linearize(tiny_model("llama"), LearnedPRF, 12, sliding_window=options)
    assert student.config.window_options["far_memory"] == "delta"
    check_generation_and_round_trip(student, tmp_path, "far_write_weight")


def test_the_fla_kernels_give_the_same_memory_and_decoding_continues_from_their_state():
    pytest.importorskip("fla.ops.gated_delta_rule.naive", reason="flash-linear-attention (pip install 'lit-dof[gpu]')")
    T = 40
    q, k, v, lq, lk, mix = (x.double() for x in _inputs(2, 4, 2, T + 1, seed=6))
    write, gates = _extras(2, 2, T + 1, 6)
    kw = {"window": 6, "sink_tokens": 2, "log_mix": mix}
    ref = naive_sliding_window_attention(q, k, v, lq, lk, far_write=write, far_log_gates=gates, **kw)
    head = [x[:, :, :T] for x in (q, k, v, lq, lk)]
    out, state = sliding_window_linear_attention(
        *head, far_write=write[:, :, :T], far_log_gates=gates[:, :, :T], linear_kernel="fla", chunk_size=8, **kw
    )
    torch.testing.assert_close(out, ref[:, :, :T], rtol=1e-5, atol=1e-5)
    tail = [x[:, :, T:] for x in (q, k, v, lq, lk)]
    step, _ = sliding_window_linear_attention(
        *tail, far_write=write[:, :, T:], far_log_gates=gates[:, :, T:], state=state, **kw
    )
    torch.testing.assert_close(step, ref[:, :, T:], rtol=1e-5, atol=1e-5)
