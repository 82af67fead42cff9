"""Feature maps: shapes, positivity, the PRF kernel formula, FAVOR+ unbiasedness and 1/√M error, resizing."""

import math

import pytest
import torch

from lit_dof.attention import (
    CausalLinearAttention,
    DiJiangFeatureMap,
    HedgehogFeatureMap,
    LearnedPRF,
    PerformerFeatureMap,
    naive_linear_attention,
)

MAPS = [LearnedPRF, PerformerFeatureMap, DiJiangFeatureMap, HedgehogFeatureMap]


@pytest.mark.parametrize("cls", MAPS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("M", [1, 7, 64, 100])
def test_shapes_positive_and_resize(cls, M):
    fm = cls(16, 3, M)  # each class is itself a factory (head_dim, num_heads, feature_dim)
    x = torch.randn(2, 3, 5, 16)
    phi = fm(x)
    assert phi.shape == (2, 3, 5, M) and (phi > 0).all()
    torch.testing.assert_close(fm.log_features(x).exp(), phi)
    before = fm.log_features(x)[..., : min(M, 5)]
    fm.resize(M + 5)
    after = fm.log_features(x)
    assert after.shape[-1] == M + 5 and fm.feature_dim == M + 5
    if cls not in (HedgehogFeatureMap, PerformerFeatureMap):  # softmax renormalises; FAVOR+ redraws
        shift = 0.5 * math.log(M / (M + 5))
        torch.testing.assert_close(after[..., : min(M, 5)], before + shift, rtol=1e-5, atol=1e-5)


def test_learned_prf_kernel_formula():
    """K̂(x, y) = (1/M) Σ α_i φ(x; z_i) φ(y; z_i), φ(x; z) = exp(zᵀx/d^¼ − ‖x‖²/(2√d))."""
    d, M = 8, 12
    fm = LearnedPRF(d, 2, M, seed=0)
    with torch.no_grad():
        fm.log_alpha.copy_(torch.randn(2, M))
    x, y = torch.randn(1, 2, 3, d, dtype=torch.float64), torch.randn(1, 2, 4, d, dtype=torch.float64)
    z, alpha = fm.z.double(), fm.alpha.double()

    def phi(v):  # (1, H, T, d) → (1, H, T, M)
        return torch.exp(v @ z.transpose(-1, -2) / d**0.25 - (v * v).sum(-1, keepdim=True) / (2 * math.sqrt(d)))

    expected = torch.einsum("bhtm,bhsm,hm->bhts", phi(x), phi(y), alpha) / M
    torch.testing.assert_close(fm.kernel(x, y), expected, rtol=1e-5, atol=1e-7)  # z is float32
    assert fm.z.requires_grad and fm.log_alpha.requires_grad


@pytest.mark.parametrize("with_norm", [True, False], ids=["keys", "queries"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_exponential_log_features_values_and_gradients(with_norm, bias):
    """log φ(x) = x·W + b − ‖x‖²/(2√d) and its gradients in x, W and b, against the formula under autograd."""
    from lit_dof.attention.feature_maps.base import exponential_log_features

    g = torch.Generator().manual_seed(3)
    d, H, M = 8, 3, 5
    x = torch.randn(2, H, 7, d, generator=g, dtype=torch.float64)
    x[0, 0, 0] = 0.0  # a zero row: ‖x‖ has no derivative there, ‖x‖² does (0)
    W = torch.randn(H, d, M, generator=g, dtype=torch.float64)
    b = torch.randn(H, 1, M, generator=g, dtype=torch.float64) if bias else None
    weight = torch.randn(2, H, 7, M, generator=g, dtype=torch.float64)

    def reference(x, W, b):
        out = x @ W + (b if b is not None else 0.0)
        return out - (x * x).sum(-1, keepdim=True) / (2 * math.sqrt(d)) if with_norm else out

    grads = []
    for fn in (exponential_log_features, reference):
        inputs = [t.clone().requires_grad_() if t is not None else None for t in (x, W, b)]
        out = fn(*inputs, with_norm) if fn is exponential_log_features else fn(*inputs)
        (out * weight).sum().backward()
        grads.append((out.detach(), [t.grad for t in inputs if t is not None]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for got, want in zip(grads[0][1], grads[1][1]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want)


def test_performer_unbiased_and_error_shrinks_like_inverse_sqrt_m():
    """Each 'head' is an independent draw of z: mean K̂ → exp(xᵀy/√d), mean |error| ∝ 1/√M."""
    d, draws = 16, 4000
    g = torch.Generator().manual_seed(0)
    x = torch.randn(d, generator=g) * 0.5
    y = torch.randn(d, generator=g) * 0.5
    exact = math.exp(float(x @ y) / math.sqrt(d))
    errors = {}
    for M in (4, 16, 64):
        fm = PerformerFeatureMap(d, draws, M, seed=M)
        k_hat = fm.kernel(x.expand(1, draws, 1, d), y.expand(1, draws, 1, d)).flatten().double()
        std_err = float(k_hat.std()) / math.sqrt(draws)
        assert abs(float(k_hat.mean()) - exact) < 4 * std_err  # unbiased
        errors[M] = float((k_hat - exact).abs().mean())
    assert errors[4] / errors[16] == pytest.approx(2.0, rel=0.3)
    assert errors[16] / errors[64] == pytest.approx(2.0, rel=0.3)
    fm = PerformerFeatureMap(d, 2, 8, seed=1)
    assert sum(p.numel() for p in fm.parameters()) == 0  # nothing trained
    z0 = fm.z.clone()
    fm.redraw()
    assert not torch.equal(z0, fm.z)


def test_performer_redraw_interval():
    fm = PerformerFeatureMap(8, 2, 8, redraw_interval=2, seed=0).train()
    z0 = fm.z.clone()
    fm.maybe_redraw()
    assert torch.equal(fm.z, z0)
    fm.maybe_redraw()
    assert not torch.equal(fm.z, z0)
    with pytest.raises(ValueError, match="redraw_interval"):
        PerformerFeatureMap(8, 2, 8, redraw_interval=-1)


def test_dijiang_structure_and_training():
    fm = DiJiangFeatureMap(8, 2, 20)
    # rows 0..7 and 16..19 are DCT rows, 8..15 their negatives, scaled by QMC χ radii
    dirs = fm.projection / fm.projection.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(dirs[:8] @ dirs[:8].t(), torch.eye(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(dirs[8:16], -dirs[:8])
    x = torch.randn(1, 2, 6, 8)
    fm(x).sum().backward()
    assert fm.log_weight.grad is not None and fm.log_weight.grad.abs().sum() > 0


def test_hedgehog_is_two_softmaxes():
    fm = HedgehogFeatureMap(8, 2, 11)
    phi = fm(torch.randn(1, 2, 4, 8))
    torch.testing.assert_close(phi[..., :6].sum(-1), torch.ones(1, 2, 4))
    torch.testing.assert_close(phi[..., 6:].sum(-1), torch.ones(1, 2, 4))


@pytest.mark.parametrize("cls", MAPS, ids=lambda c: c.__name__)
def test_invalid_arguments(cls):
    for bad in (0, -3):
        with pytest.raises(ValueError, match="feature_dim"):
            cls(8, 2, bad)
    fm = cls(8, 2, 4)
    with pytest.raises(ValueError, match="feature_dim"):
        fm.resize(0)
    with pytest.raises(ValueError, match=r"H=2"):
        fm(torch.randn(1, 3, 4, 8))
    with pytest.raises(ValueError, match="NaN"):
        fm(torch.full((1, 2, 4, 8), float("nan")))


@pytest.mark.parametrize("cls", MAPS, ids=lambda c: c.__name__)
def test_layer_matches_reference_with_gqa(cls):
    """The layer (shared maps per KV head) equals the naive reference on the exact log-features."""
    torch.manual_seed(0)
    layer = CausalLinearAttention(cls(8, 2, 12), num_heads=6, num_kv_heads=2, chunk_size=16)
    q, k, v = torch.randn(2, 6, 45, 8), torch.randn(2, 2, 45, 8), torch.randn(2, 2, 45, 5)
    y, state = layer(q, k, v)
    fm = layer.feature_map
    lq = fm.log_features(q.reshape(2, 2, 3 * 45, 8)).view(2, 6, 45, 12)
    ref = naive_linear_attention(lq, fm.log_features(k), v)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    assert state.kv.shape == (2, 2, 12, 5)
    # decoding from a prefill state continues the same sequence
    head, st = layer(q[:, :, :30], k[:, :, :30], v[:, :, :30])
    steps = []
    for t in range(30, 45):
        out, st = layer(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], st)
        steps.append(out)
    torch.testing.assert_close(torch.cat([head, *steps], 2), y, rtol=1e-4, atol=1e-5)


def test_per_query_head_maps_equal_shared_maps_when_tied():
    torch.manual_seed(1)
    shared = CausalLinearAttention(LearnedPRF(8, 2, 10), 6, 2)
    per_head = CausalLinearAttention(LearnedPRF(8, 6, 10), 6, 2)
    with torch.no_grad():
        per_head.feature_map.z.copy_(shared.feature_map.z.repeat_interleave(3, 0))
    assert shared.shares_kv_maps and not per_head.shares_kv_maps
    q, k, v = torch.randn(1, 6, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 4)
    y1, s1 = shared(q, k, v)
    y2, s2 = per_head(q, k, v)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-6)
    assert s1.kv.shape[1] == 2 and s2.kv.shape[1] == 6  # GQA's state saving survives only when shared
    with pytest.raises(ValueError, match="num_heads"):
        CausalLinearAttention(LearnedPRF(8, 4, 10), 6, 2)


@pytest.mark.parametrize("cls", MAPS, ids=lambda c: c.__name__)
def test_built_in_float32_under_bf16_default_dtype(cls, bf16_default_dtype):
    """Built where Lightning's ``bf16-true`` builds it (default dtype bfloat16, where QR has no kernel) the
    map works and every parameter/buffer is float32, equal to the one built under float32 (same seed); its
    bf16 conversion (``convert_module``) keeps them float32 and unchanged, and float64 still applies."""
    kwargs = {"seed": 3}
    fm = cls(8, 2, 20, **kwargs)
    torch.set_default_dtype(torch.float32)
    try:
        reference = cls(8, 2, 20, **kwargs)
    finally:
        torch.set_default_dtype(bf16_default_dtype)
    tensors = dict(fm.state_dict())
    assert tensors and all(t.dtype == torch.float32 for t in tensors.values())
    for name, want in reference.state_dict().items():
        torch.testing.assert_close(tensors[name], want, rtol=0, atol=0)
    fm.to(torch.bfloat16)
    assert all(torch.equal(t, tensors[n]) and t.dtype == torch.float32 for n, t in fm.state_dict().items())
    x = torch.randn(2, 2, 5, 8, dtype=torch.float32)
    torch.testing.assert_close(fm.log_features(x.bfloat16()), reference.log_features(x.bfloat16().float()))
    assert all(t.dtype == torch.float64 for t in fm.double().state_dict().values())


@pytest.mark.parametrize("cls", MAPS, ids=lambda c: c.__name__)
def test_log_features_under_bf16_autocast_are_float32(cls):
    """Under CPU bf16 autocast the log-features (plain and attention form) and their parameter gradients
    equal the float32 computation to float32 rounding."""
    fm = cls(8, 2, 12, seed=5)
    q, k = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)

    def run(autocast: bool):
        fm.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            plain = fm.log_features(k)
            lq, lk = fm.attention_log_features(q, k)
        loss = plain.sum() + lq.square().sum() + lk.sum()
        if loss.requires_grad:  # Performer has no parameters
            loss.backward()
        grads = [p.grad.clone() for p in fm.parameters()]
        return [plain, lq, lk], grads

    (outs, grads), (ref_outs, ref_grads) = run(True), run(False)
    for got, want in zip(outs + grads, ref_outs + ref_grads):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    "bad, refused", [(float("nan"), True), (float("inf"), True), (-float("inf"), False), (3e38, False)]
)
def test_finite_check_refuses_nan_and_plus_inf_only(bad, refused):
    """log-features may be −inf (a zero feature); NaN and +inf are refused wherever they sit."""
    from lit_dof.attention._validation import check_finite

    for where in (0, 17, -1):
        x = torch.randn(2, 3, 5, 4).double()
        x.view(-1)[where] = bad
        if refused:
            with pytest.raises(ValueError, match="x contains NaN or \\+inf"):
                check_finite("x", x)
        else:
            check_finite("x", x)
    check_finite("x", torch.empty(0, 3))
