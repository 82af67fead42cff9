"""The far term on flash-linear-attention (``linear_kernel="fla"``), wired through fla's own pure-PyTorch
reference (``naive_chunk_simple_gla``, what :func:`~lit_dof.attention.ops.linear.fla.fla_kernel` gives off CUDA):
equal to the PyTorch chunked path and to the quadratic float64 reference, forward and gradients, with decay, GQA, sinks,
padding, large log-features, a carried state and decoding after it. Skipped where fla cannot be installed."""

import pytest
import torch

pytest.importorskip("fla.ops.simple_gla.naive", reason="flash-linear-attention (pip install 'lit-dof[gpu]')")

from lit_dof.attention.ops.linear.aligned import aligned_linear_attention  # noqa: E402
from lit_dof.attention.ops.linear.fla import fla_aligned_linear_attention  # noqa: E402
from lit_dof.attention.ops.linear.state import LinearAttentionState  # noqa: E402
from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention  # noqa: E402
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported")


def _inputs(B, Hq, Hk, T, d=8, M=6, D=5, scale=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, Hq, T, d, generator=g), torch.randn(B, Hk, T, d, generator=g)
    v = torch.randn(B, Hk, T, D, generator=g)
    lq, lk = torch.randn(B, Hq, T, M, generator=g) * scale, torch.randn(B, Hk, T, M, generator=g) * scale
    return q, k, v, lq, lk, torch.randn(Hq, generator=g), torch.rand(Hk, generator=g) * 0.2


@pytest.mark.parametrize("gated", [False, True], ids=["decay", "data-dependent-gates"])
@pytest.mark.parametrize("scale", [1.5, 30.0], ids=["moderate", "large-log-features"])
@pytest.mark.parametrize("N", [5, 700], ids=["one-segment", "two-segments"])
def test_aligned_far_term_equals_the_pytorch_path_with_a_carried_state(N, scale, gated):
    _, _, v, lq, lk, _, decay = _inputs(2, 4, 2, N, scale=scale)
    g = torch.Generator().manual_seed(1)
    gates = -decay[None, :, None].expand(2, 2, N)
    if gated:  # a different forget gate at every token, up to 1/4 nat
        gates = -0.25 * torch.rand(2, 2, N, generator=torch.Generator().manual_seed(2))
    state = LinearAttentionState(
        torch.rand(2, 2, 6, 5, generator=g),
        torch.rand(2, 2, 6, generator=g) + 1,
        torch.randn(2, 2, 6, generator=g) * scale,
    )
    got = fla_aligned_linear_attention(lq, lk, v, state, gates)
    ref = aligned_linear_attention(lq, lk, v, state, chunk_size=64, log_gates=gates)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-4)
    a, b = got[2], ref[2]  # the states describe the same sums, in scales of their own
    top = torch.maximum(a.log_scale, b.log_scale).double()
    for x, y in ((a.kv, b.kv), (a.k_sum[..., None], b.k_sum[..., None])):
        scaled = [t.double() * (s.log_scale.double() - top).exp()[..., None] for t, s in ((x, a), (y, b))]
        torch.testing.assert_close(scaled[0], scaled[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "left-padded"])
def test_the_layer_with_fla_matches_the_float64_reference_forward_and_gradients(padded):
    T, window, sinks = 90, 16, 3
    inputs = [x.double().requires_grad_() for x in _inputs(2, 4, 2, T, seed=2)]
    mask = torch.ones(2, T, dtype=torch.bool)
    if padded:
        mask[1, :20] = False
    kw = {"window": window, "sink_tokens": sinks, "key_padding_mask": mask}
    weight = torch.randn(2, 4, T, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weight = weight.masked_fill(~mask[:, None, :, None], 0)
    ref_in = [x.detach().clone().requires_grad_() for x in inputs]
    q, k, v, lq, lk, mix, decay = ref_in
    ref = naive_sliding_window_attention(q, k, v, lq, lk, log_mix=mix, far_decay=decay, **kw)
    (ref.masked_fill(~mask[:, None, :, None], 0) * weight).sum().backward()
    q, k, v, lq, lk, mix, decay = inputs
    out, state = sliding_window_linear_attention(
        q, k, v, lq, lk, log_mix=mix, far_decay=decay, chunk_size=16, linear_kernel="fla", **kw
    )
    out = out.masked_fill(~mask[:, None, :, None], 0)
    (out * weight).sum().backward()
    torch.testing.assert_close(out, ref.masked_fill(~mask[:, None, :, None], 0), rtol=1e-5, atol=1e-6)
    for name, x, r in zip("q k v lq lk mix decay".split(), inputs, ref_in):
        assert torch.isfinite(x.grad).all(), name
        known = torch.isfinite(r.grad)  # the reference's padding rows are NaN, and so its gradients through them
        # λ's gradient sums ~T²/2 distance-weighted float32 terms (either kernel): its rounding is ~1e-4 absolute
        tol = {"rtol": 1e-4, "atol": 1e-4 if name == "decay" else 1e-5}
        torch.testing.assert_close(x.grad[known], r.grad[known], **tol, msg=lambda m, n=name: f"{n}: {m}")
    if padded:
        assert (inputs[2].grad[1, :, :20] == 0).all()  # padding values never count
    # decoding continues from the state the fla path left
    nxt = [x.detach()[:, :, -1:] * 0.5 for x in inputs[:5]]
    step, _ = sliding_window_linear_attention(
        *nxt, log_mix=mix.detach(), far_decay=decay.detach(), state=state, window=window, sink_tokens=sinks
    )
    full = [torch.cat([x.detach(), y], 2) for x, y in zip(inputs[:5], nxt)]
    ref_full = naive_sliding_window_attention(
        *full,
        log_mix=mix.detach(),
        far_decay=decay.detach(),
        window=window,
        sink_tokens=sinks,
        key_padding_mask=torch.cat([mask, mask[:, -1:]], 1),
    )
    torch.testing.assert_close(step, ref_full[:, :, -1:], rtol=1e-5, atol=1e-6)


def test_an_unknown_kernel_is_refused():
    q, k, v, lq, lk, _, _ = _inputs(1, 2, 2, 8)
    with pytest.raises(ValueError, match="linear_kernel must be 'torch' or 'fla', got 'triton'"):
        sliding_window_linear_attention(q, k, v, lq, lk, window=2, linear_kernel="triton")


def test_gated_far_term_on_fla_matches_the_float64_reference_and_decoding_continues_from_its_state():
    T, window, sinks = 80, 8, 2
    q, k, v, lq, lk, mix, _ = (x.double() for x in _inputs(2, 4, 2, T + 1, seed=3))
    gates = -0.2 * torch.rand(2, 2, T + 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref_gates = gates.clone().requires_grad_()
    ref = naive_sliding_window_attention(
        q, k, v, lq, lk, log_mix=mix, far_log_gates=ref_gates, window=window, sink_tokens=sinks
    )
    weight = torch.randn(2, 4, T, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (ref[:, :, :T] * weight).sum().backward()
    fla_gates = gates[:, :, :T].clone().requires_grad_()
    kw = {"log_mix": mix, "window": window, "sink_tokens": sinks}
    out, state = sliding_window_linear_attention(
        *(x[:, :, :T] for x in (q, k, v, lq, lk)), far_log_gates=fla_gates, chunk_size=16, linear_kernel="fla", **kw
    )
    torch.testing.assert_close(out, ref[:, :, :T], rtol=1e-5, atol=1e-6)
    (out * weight).sum().backward()
    torch.testing.assert_close(fla_gates.grad, ref_gates.grad[:, :, :T], rtol=1e-4, atol=1e-5)
    step, _ = sliding_window_linear_attention(  # the PyTorch decoding step after fla's prefill: same state convention
        *(x[:, :, T:] for x in (q, k, v, lq, lk)), far_log_gates=gates[:, :, T:], state=state, **kw
    )
    torch.testing.assert_close(step, ref[:, :, T:].detach(), rtol=1e-5, atol=1e-6)


def test_the_cuda_entry_points_get_their_arguments_by_name(monkeypatch):
    """On CUDA the kernels are fla's Triton entry points; here each is replaced by a recorder with its real signature,
    so an argument that lands in the wrong parameter fails on the CPU (fla ≥ 0.2 puts ``g_gamma``, a per-head decay,
    fifth in ``chunk_simple_gla``: a positional scale there failed only on a GPU)."""
    import inspect

    import fla.ops.gated_delta_rule as delta_module
    import fla.ops.simple_gla as gla_module

    from lit_dof.attention.ops.delta_rule.fla import fla_delta_kernel
    from lit_dof.attention.ops.linear.fla import fla_kernel

    calls = {}

    def recorder(real, key):
        def fake(*args, **kwargs):
            calls[key] = inspect.signature(real).bind(*args, **kwargs).arguments
            return None, None

        return fake

    monkeypatch.setattr(gla_module, "chunk_simple_gla", recorder(gla_module.chunk_simple_gla, "gla"))
    monkeypatch.setattr(delta_module, "chunk_gated_delta_rule", recorder(delta_module.chunk_gated_delta_rule, "delta"))
    q, k, v, g, beta, h0 = (torch.full((1,), float(i)) for i in range(6))
    fla_kernel(torch.device("cuda"))(q, k, v, g, 1.0, h0, True)
    fla_delta_kernel(torch.device("cuda"))(q, k, v, beta, g, h0)
    gla, delta = calls["gla"], calls["delta"]
    assert "g_gamma" not in gla and gla["g"] is g and gla["scale"] == 1.0
    assert gla["initial_state"] is h0 and gla["output_final_state"] is True
    assert (gla["q"], gla["k"], gla["v"]) == (q, k, v)
    assert delta["g"] is g and delta["beta"] is beta and delta["scale"] == 1.0
    assert delta["initial_state"] is h0 and delta["output_final_state"] is True
