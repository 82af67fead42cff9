"""The chunked and recurrent kernels against the quadratic float64 reference (forward and gradients)."""

import pytest
import torch

from lit_dof.attention import (
    LearnedPRF,
    LinearAttentionState,
    chunked_linear_attention,
    naive_linear_attention,
    recurrent_linear_attention,
)


def _inputs(B, Hq, Hk, T, M, D, scale=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lq = torch.randn(B, Hq, T, M, generator=g) * scale
    lk = torch.randn(B, Hk, T, M, generator=g) * scale
    v = torch.randn(B, Hk, T, D, generator=g)
    return lq, lk, v


def _grads(fn, *inputs, weight):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    (out * weight.to(out.dtype)).sum().backward()
    return out.detach(), [x.grad for x in inputs]


LENGTHS = [1, 63, 100, 257]
LAYOUTS = {"mha": (4, 4), "gqa": (6, 2)}


@pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")
@pytest.mark.parametrize("chunk,block", [(16, 1024), (50, 1024), (7, 21)], ids=["C16", "C50", "C7-block21"])
@pytest.mark.parametrize("layout", list(LAYOUTS), ids=str)
def test_chunked_matches_naive_forward_and_grad(T, chunk, block, layout):
    Hq, Hk = LAYOUTS[layout]
    lq, lk, v = _inputs(2, Hq, Hk, T, 12, 8)
    weight = torch.randn(2, Hq, T, 8, dtype=torch.float64)
    ref, ref_grads = _grads(naive_linear_attention, lq.double(), lk.double(), v.double(), weight=weight)
    out, grads = _grads(
        lambda a, b, c: chunked_linear_attention(a, b, c, chunk_size=chunk, block_size=block), lq, lk, v, weight=weight
    )
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")
@pytest.mark.parametrize("layout", list(LAYOUTS), ids=str)
def test_recurrent_matches_naive_forward_and_grad(T, layout):
    Hq, Hk = LAYOUTS[layout]
    lq, lk, v = _inputs(1, Hq, Hk, T, 10, 6, seed=1)
    weight = torch.randn(1, Hq, T, 6, dtype=torch.float64)
    ref, ref_grads = _grads(naive_linear_attention, lq.double(), lk.double(), v.double(), weight=weight)
    out, grads = _grads(recurrent_linear_attention, lq, lk, v, weight=weight)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("split", [1, 37, 64, 99])
def test_prefill_state_continues_exactly(split):
    """Prefill (chunked) to `split`, then continue chunked or token by token: same as one pass."""
    lq, lk, v = _inputs(2, 6, 3, 100, 8, 5, seed=2)
    full, full_state = chunked_linear_attention(lq, lk, v, chunk_size=16)
    head, state = chunked_linear_attention(lq[:, :, :split], lk[:, :, :split], v[:, :, :split], chunk_size=16)
    tail_chunked, s1 = chunked_linear_attention(
        lq[:, :, split:], lk[:, :, split:], v[:, :, split:], chunk_size=16, initial_state=state
    )
    tail_steps, s2 = recurrent_linear_attention(
        lq[:, :, split:], lk[:, :, split:], v[:, :, split:], initial_state=state
    )
    torch.testing.assert_close(torch.cat([head, tail_chunked], 2), full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([head, tail_steps], 2), full, rtol=1e-5, atol=1e-6)
    for s in (s1, s2):  # the same prefix summary, whatever the stabiliser path
        scale = torch.exp(s.log_scale - full_state.log_scale)
        torch.testing.assert_close(s.k_sum * scale, full_state.k_sum, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(s.kv * scale.unsqueeze(-1), full_state.kv, rtol=1e-5, atol=1e-6)


def test_state_is_constant_size():
    lq, lk, v = _inputs(1, 4, 2, 300, 8, 5)
    _, short = chunked_linear_attention(lq[:, :, :3], lk[:, :, :3], v[:, :, :3])
    _, long = chunked_linear_attention(lq, lk, v)
    assert short.nbytes == long.nbytes == 4 * (1 * 2 * 8 * 5 + 2 * 1 * 2 * 8)
    assert long.kv.shape == (1, 2, 8, 5) and long.k_sum.shape == (1, 2, 8) and long.kv.dtype == torch.float32


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_causality(form):
    lq, lk, v = _inputs(1, 2, 2, 80, 8, 4, seed=3)
    fn = (
        (lambda a, b, c: chunked_linear_attention(a, b, c, chunk_size=16))
        if form == "chunked"
        else recurrent_linear_attention
    )
    base, _ = fn(lq, lk, v)
    t = 45
    lq2, lk2, v2 = lq.clone(), lk.clone(), v.clone()
    lq2[:, :, t:] += 3.0
    lk2[:, :, t:] -= 2.0
    v2[:, :, t:] = torch.randn_like(v2[:, :, t:])
    changed, _ = fn(lq2, lk2, v2)
    if form == "recurrent":
        assert torch.equal(changed[:, :, :t], base[:, :, :t])
    else:  # the block's stabiliser sees later keys: causal exactly in real arithmetic, to rounding in float32
        torch.testing.assert_close(changed[:, :, :t], base[:, :, :t], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(changed[:, :, t:], base[:, :, t:])


def test_gqa_equals_repeated_keys():
    lq, lk, v = _inputs(2, 8, 2, 70, 8, 6, seed=4)
    grouped, state = chunked_linear_attention(lq, lk, v, chunk_size=16)
    repeated, _ = chunked_linear_attention(lq, lk.repeat_interleave(4, 1), v.repeat_interleave(4, 1), chunk_size=16)
    torch.testing.assert_close(grouped, repeated, rtol=1e-5, atol=1e-6)
    assert state.kv.shape[1] == 2  # one state per KV head


def test_large_norms_match_reference():
    """Exponents far outside float32's exp range (|log φ| ~ 100s) are still exact."""
    lq, lk, v = _inputs(1, 2, 2, 200, 16, 4, scale=60.0, seed=5)
    ref = naive_linear_attention(lq.double(), lk.double(), v.double())
    out, _ = chunked_linear_attention(lq, lk, v, chunk_size=32)
    step, _ = recurrent_linear_attention(lq, lk, v)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(step.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scale", [20.0, 60.0])
def test_large_norm_gradients_match_reference(scale):
    """Rows whose normaliser is tiny under the block's stabiliser (den ~ 1e-20…1e-30 at these scales) have a
    1/den² in the backward that overflows float32: before the fix, NaN gradients (and, on accelerators,
    where the fallback was off, wrong outputs). The finer-stabiliser fallback keeps both exact."""
    lq, lk, v = _inputs(1, 2, 2, 200, 16, 4, scale=scale, seed=5)
    weight = torch.randn(1, 2, 200, 4, dtype=torch.float64)
    ref, ref_grads = _grads(naive_linear_attention, lq.double(), lk.double(), v.double(), weight=weight)
    out, grads = _grads(lambda a, b, c: chunked_linear_attention(a, b, c, chunk_size=64), lq, lk, v, weight=weight)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4 * r.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_sequence_large_norm_is_finite(dtype):
    """T = 32768 with ‖q‖ = ‖k‖ = 30 through the learned PRF map: finite in float32 and bfloat16."""
    g = torch.Generator().manual_seed(6)
    d, H, T = 64, 2, 32768
    q, k = (torch.nn.functional.normalize(torch.randn(1, H, T, d, generator=g), dim=-1) * 30 for _ in range(2))
    v = torch.randn(1, H, T, d, generator=g)
    fm = LearnedPRF(d, H, 32, seed=0)
    with torch.no_grad():
        lq, lk = fm.log_features(q.to(dtype)), fm.log_features(k.to(dtype))
        assert torch.isinf(fm(k)).any() or (fm(k) == 0).any()  # plain φ would over/underflow here
        out, state = chunked_linear_attention(lq, lk, v.to(dtype))
    assert out.dtype == dtype and state.kv.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(state.kv).all() and torch.isfinite(state.k_sum).all()
    # rows are convex combinations of the values
    assert (out.float().abs().amax(-1) <= v.abs().amax() * 1.01).all()


def test_bf16_inputs_accumulate_in_fp32():
    lq, lk, v = _inputs(1, 2, 2, 130, 8, 4, seed=7)
    ref = naive_linear_attention(lq.bfloat16().double(), lk.bfloat16().double(), v.bfloat16().double())
    out, state = chunked_linear_attention(lq.bfloat16(), lk.bfloat16(), v.bfloat16(), chunk_size=32)
    assert out.dtype == torch.bfloat16 and state.kv.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)  # only the final cast rounds


AUTOCAST_FORMS = {
    "chunked": lambda lq, lk, v, state=None: chunked_linear_attention(
        lq, lk, v, chunk_size=16, block_size=32, initial_state=state
    ),
    "recurrent": lambda lq, lk, v, state=None: recurrent_linear_attention(lq, lk, v, initial_state=state),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("form", list(AUTOCAST_FORMS))
def test_kernels_under_autocast_compute_in_fp32(form, dtype):
    """Under CPU autocast to bfloat16 / float16 (Lightning's ``bf16-mixed`` / ``16-mixed``) the kernels run
    (the chunked one used to fail: autocast lowers ``bmm`` but not the in-place ``baddbmm_``) and give the
    plain float32 call's outputs, states and gradients to float32 rounding — not bf16's 1e-2 — also when
    continuing a state; the outputs also match the float64 reference."""
    fn = AUTOCAST_FORMS[form]
    lq, lk, v = _inputs(2, 6, 2, 70, 12, 8, seed=11)
    weight = torch.randn(2, 6, 70, 8, generator=torch.Generator().manual_seed(12))
    prefix = chunked_linear_attention(*(x[:, :, :9] for x in (lq, lk, v)))[1]
    rest = [x[:, :, 9:] for x in (lq, lk, v)]
    ref, ref_grads = _grads(lambda *x: fn(*x, prefix), *rest, weight=weight[:, :, 9:])
    ref_state = fn(*rest, prefix)[1]
    inputs = [x.clone().requires_grad_() for x in rest]
    with torch.autocast("cpu", dtype=dtype):  # the forward only, as Lightning does
        out, state = fn(*inputs, prefix)
    (out * weight[:, :, 9:]).sum().backward()
    grads = [x.grad for x in inputs]
    assert out.dtype == torch.float32 and state.kv.dtype == torch.float32
    tight = dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, ref, **tight)
    for got, want in zip(
        grads + [state.kv, state.k_sum, state.log_scale],
        ref_grads + [ref_state.kv, ref_state.k_sum, ref_state.log_scale],
    ):
        torch.testing.assert_close(got, want, **tight)
    exact = naive_linear_attention(*(x.double() for x in (lq, lk, v)))[:, :, 9:]  # the float64 reference
    torch.testing.assert_close(out.double(), exact, rtol=1e-4, atol=1e-5)


def test_bf16_inputs_under_autocast_return_bf16():
    """bf16 inputs under autocast (``bf16-true`` teacher activations inside a mixed region): output in v's
    dtype, equal to the call on the same values upcast to float32 then rounded once."""
    lq, lk, v = (x.bfloat16() for x in _inputs(1, 2, 2, 50, 8, 4, seed=13))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = chunked_linear_attention(lq, lk, v, chunk_size=16)
    ref, _ = chunked_linear_attention(lq.float(), lk.float(), v.float(), chunk_size=16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(chunk_size=0), "chunk_size"),
        (dict(block_size=-1), "block_size"),
        (dict(initial_state=LinearAttentionState.empty(1, 3, 8, 4)), "state"),
    ],
)
def test_invalid_arguments(kwargs, match):
    lq, lk, v = _inputs(1, 4, 2, 10, 8, 4)
    with pytest.raises(ValueError, match=match):
        chunked_linear_attention(lq, lk, v, **kwargs)


def test_invalid_shapes_and_nan():
    lq, lk, v = _inputs(1, 4, 3, 10, 8, 4)
    with pytest.raises(ValueError, match="multiple"):
        chunked_linear_attention(lq, lk, v)
    lq, lk, v = _inputs(1, 4, 2, 10, 8, 4)
    with pytest.raises(ValueError, match="log_phi_k"):
        chunked_linear_attention(lq, lk[..., :4], v)
    lq[0, 0, 3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        chunked_linear_attention(lq, lk, v)
    with pytest.raises(ValueError, match="NaN"):
        recurrent_linear_attention(lq, lk, v)


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_log_normalizer_is_the_log_of_the_row_mass(form):
    """``return_log_normalizer``: log Σ_{j≤i} K̂(q_i, k_j), state included, against the float64 kernel matrix."""
    from lit_dof.attention import log_kernel_matrix

    lq, lk, v = _inputs(1, 4, 2, 23, 6, 5, seed=5)
    head, state = chunked_linear_attention(lq[:, :, :9], lk[:, :, :9], v[:, :, :9], chunk_size=4)
    fn = (
        (lambda *a, **kw: chunked_linear_attention(*a, chunk_size=4, **kw))
        if form == "chunked"
        else recurrent_linear_attention
    )
    _, _, log_z = fn(lq[:, :, 9:], lk[:, :, 9:], v[:, :, 9:], initial_state=state, return_log_normalizer=True)
    logits = log_kernel_matrix(lq.double(), lk.double().repeat_interleave(2, 1))  # (1, 4, 23, 23)
    causal = torch.ones(23, 23, dtype=torch.bool).tril()
    ref = logits.masked_fill(~causal, -torch.inf).logsumexp(-1)[:, :, 9:]
    torch.testing.assert_close(log_z.double(), ref, rtol=1e-5, atol=1e-5)
