"""The kernels on a CUDA device against the float64 CPU reference (skipped without a GPU; CI has none).

Run where a GPU exists: ``python -m pytest tests/attention/test_cuda.py``.
"""

import pytest
import torch

from lit_dof.attention import (
    CausalLinearAttention,
    LearnedPRF,
    chunked_linear_attention,
    naive_linear_attention,
    recurrent_linear_attention,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(T, Hq=6, Hk=2, M=16, D=8, scale=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, Hq, T, M, generator=g) * scale,
        torch.randn(2, Hk, T, M, generator=g) * scale,
        torch.randn(2, Hk, T, D, generator=g),
    )


@pytest.mark.parametrize("T", [1, 63, 257, 1000])
@pytest.mark.parametrize("scale", [1.5, 20.0])  # 20: tiny row normalisers, which once gave NaN gradients on CUDA
def test_chunked_and_recurrent_on_cuda_match_the_cpu_reference(T, scale):
    lq, lk, v = _inputs(T, scale=scale)
    weight = torch.randn(2, 6, T, 8, dtype=torch.float64)
    ref = naive_linear_attention(lq.double(), lk.double(), v.double())
    inputs = [x.cuda().requires_grad_() for x in (lq, lk, v)]
    out, state = chunked_linear_attention(*inputs, chunk_size=50)
    (out.double().cpu() * weight).sum().backward()
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    ref_inputs = [x.double().requires_grad_() for x in (lq, lk, v)]
    (naive_linear_attention(*ref_inputs) * weight).sum().backward()
    for x, r in zip(inputs, ref_inputs):
        torch.testing.assert_close(
            x.grad.double().cpu(), r.grad, rtol=1e-4, atol=1e-5 * max(1.0, r.grad.abs().max().item())
        )
    step, step_state = recurrent_linear_attention(*(x.detach() for x in inputs))
    torch.testing.assert_close(step.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step_state.kv * step_state.log_scale.exp()[..., None],
                               state.kv * state.log_scale.exp()[..., None], rtol=1e-4,
                               atol=1e-5)  # fmt: skip  # packed args


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_sequence_large_norm_is_finite_on_cuda(dtype):
    """T = 32768, ‖q‖ = ‖k‖ = 30, SmolLM2's head layout (9 query heads, 3 KV heads): finite outputs."""
    g = torch.Generator().manual_seed(6)
    d, T = 64, 32768
    q = torch.nn.functional.normalize(torch.randn(1, 9, T, d, generator=g), dim=-1) * 30
    k = torch.nn.functional.normalize(torch.randn(1, 3, T, d, generator=g), dim=-1) * 30
    v = torch.randn(1, 3, T, d, generator=g)
    layer = CausalLinearAttention(LearnedPRF(d, 3, 64, seed=0), 9, 3).cuda()
    with torch.no_grad():
        out, state = layer(q.cuda().to(dtype), k.cuda().to(dtype), v.cuda().to(dtype))
    assert out.dtype == dtype and state.kv.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(state.kv).all()
    assert (out.float().abs().amax(-1) <= v.abs().amax().cuda() * 1.01).all()  # convex combinations of values


def test_seeded_draws_inside_a_cuda_default_device_context_match_the_cpu():
    """Lightning builds modules inside ``with torch.device("cuda")``: seeded draws from CPU generators (random
    features, the q/k reservoir, the λ search's subsample) must neither fail there nor change with the device."""
    from lit_dof.attention.feature_maps.base import orthogonal_gaussian
    from lit_dof.teacher.capture import QKReservoir

    expected = orthogonal_gaussian(3, 80, 16, generator=torch.Generator().manual_seed(0))
    vectors = torch.randn(3, 50, 16)
    reference = QKReservoir(8, seed=1)
    reference.add(0, vectors)
    with torch.device("cuda"):
        features = orthogonal_gaussian(3, 80, 16, generator=torch.Generator().manual_seed(0))
        reservoir = QKReservoir(8, seed=1)
        reservoir.add(0, vectors.cuda())
    torch.testing.assert_close(features.cpu(), expected)
    torch.testing.assert_close(reservoir.samples(0), reference.samples(0))


def _fla_available() -> bool:
    try:
        import fla.ops.simple_gla  # noqa: F401
    except ImportError:
        return False
    return True


KERNELS = [
    ("torch", "torch"),
    ("flex", "torch"),
    pytest.param("flex", "fla", marks=pytest.mark.skipif(not _fla_available(), reason="needs the gpu extra")),
]


@pytest.mark.parametrize("kernel, linear_kernel", KERNELS)
@pytest.mark.parametrize(
    "T, window, sinks, chunk", [(67, 16, 4, 16), (300, 64, 4, 64), (129, 7, 0, 32), (700, 64, 4, 64)]
)
def test_sliding_window_on_cuda_matches_the_float64_reference(T, window, sinks, chunk, kernel, linear_kernel):
    """Window + sinks + linear far term, GQA, T not a multiple of the window: forward and gradients of every
    input on the GPU in float32 equal the quadratic float64 CPU reference, with the window by the banded softmax
    or by compiled flex_attention (its log-normaliser's gradient included), the far term by the chunked kernel or
    fla's Triton simple GLA (T = 700: two segments); prefill then decode equals one pass."""
    from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
    from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention

    g = torch.Generator().manual_seed(T)
    shapes = [(2, 6, T, 8), (2, 2, T, 8), (2, 2, T, 5), (2, 6, T, 16), (2, 2, T, 16), (6,)]
    cpu = [torch.randn(*s, generator=g) for s in shapes]
    cpu[3], cpu[4] = cpu[3] * 1.5, cpu[4] * 1.5  # log-features of either sign
    weight = torch.randn(2, 6, T, 5, generator=g, dtype=torch.float64)
    kw = dict(window=window, sink_tokens=sinks)
    ref_inputs = [x.double().requires_grad_() for x in cpu]
    ref = naive_sliding_window_attention(*ref_inputs[:5], log_mix=ref_inputs[5], **kw)
    (ref * weight).sum().backward()
    inputs = [x.cuda().requires_grad_() for x in cpu]
    out, _ = sliding_window_linear_attention(
        *inputs[:5], log_mix=inputs[5], chunk_size=chunk, window_kernel=kernel, linear_kernel=linear_kernel, **kw
    )
    (out.double().cpu() * weight).sum().backward()
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    for name, x, r in zip(["q", "k", "v", "log_phi_q", "log_phi_k", "log_mix"], inputs, ref_inputs):
        torch.testing.assert_close(x.grad.double().cpu(), r.grad, rtol=1e-4,
                                   atol=1e-5 * max(1.0, r.grad.abs().max().item()),
                                   msg=lambda m, n=name: f"grad {n}: {m}")  # fmt: skip  # packed args
    state, outs, start = None, [], 0
    with torch.no_grad():
        for n in (T // 3, 1, 1, T - T // 3 - 2):
            part = [x.detach()[:, :, start : start + n] for x in inputs[:5]]
            y, state = sliding_window_linear_attention(
                *part,
                log_mix=inputs[5].detach(),
                state=state,
                chunk_size=chunk,
                window_kernel=kernel,
                linear_kernel=linear_kernel,
                **kw,
            )
            outs.append(y)
            start += n
    torch.testing.assert_close(torch.cat(outs, 2).double().cpu(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("linear_kernel", ["torch", pytest.param("fla", marks=pytest.mark.skipif(
    not _fla_available(), reason="needs the gpu extra"))])  # fmt: skip
@pytest.mark.parametrize("memory", ["gated", "delta"])
def test_gated_and_delta_far_memories_on_cuda_match_the_float64_reference(memory, linear_kernel):
    """The far memories of issue #45 on the GPU (chunked PyTorch kernels, or fla's simple GLA and gated delta rule):
    forward and the gates' and writes' gradients equal the float64 CPU reference; decoding continues the prefill."""
    from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
    from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention

    T, g = 300, torch.Generator().manual_seed(7)
    shapes = [(2, 6, T, 8), (2, 2, T, 8), (2, 2, T, 5), (2, 6, T, 16), (2, 2, T, 16), (6,)]
    cpu = [torch.randn(*s, generator=g) for s in shapes]
    cpu.append(-0.1 * torch.rand(2, 2, T, generator=g))  # forget gates
    cpu.append(torch.rand(2, 2, T, generator=g) if memory == "delta" else None)  # writes
    kw = dict(window=32, sink_tokens=4)
    ref_in = [None if x is None else x.double().requires_grad_() for x in cpu]
    ref = naive_sliding_window_attention(*ref_in[:5], log_mix=ref_in[5], far_log_gates=ref_in[6], far_write=ref_in[7],
                                         **kw)  # fmt: skip
    weight = torch.randn(2, 6, T, 5, generator=g, dtype=torch.float64)
    (ref * weight).sum().backward()
    inputs = [None if x is None else x.cuda().requires_grad_() for x in cpu]
    out, state = sliding_window_linear_attention(*inputs[:5], log_mix=inputs[5], far_log_gates=inputs[6],
                                                 far_write=inputs[7], chunk_size=64, linear_kernel=linear_kernel,
                                                 **kw)  # fmt: skip
    (out.double().cpu() * weight).sum().backward()
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-5)
    for name, x, r in zip(["gates", "writes"], inputs[6:], ref_in[6:]):
        if x is not None:
            scale = max(1.0, r.grad.abs().max().item())
            torch.testing.assert_close(x.grad.double().cpu(), r.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
