"""Degrees of freedom against closed forms, eigvalsh, and the paper's GPT-2 allocation (Table 2)."""

import math
import warnings

import pytest
import torch

from lit_dof.dof import (
    DegenerateAllocationWarning,
    allocate_feature_dims,
    degrees_of_freedom,
    dof_eigvalsh,
    layer_dof,
    log_gram,
    select_lambda,
)


def _orthogonal(J, d, radius, seed=0):
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q[:J] * radius  # J orthonormal rows scaled to norm `radius`


# Without merging, R = 11ᵀ is singular, so only moderate λ/c is resolvable; merging handles any scale.
IDENTICAL_CASES = [(n, lam, True) for n in (0.5, 3.0, 150.0) for lam in (2.0**-4, 1.0, 2.0**40)] + [
    (n, lam, False) for n in (0.5, 3.0) for lam in (2.0**-4, 1.0)
]


@pytest.mark.parametrize("norm2_over_s, lam, dedupe", IDENTICAL_CASES)
def test_identical_vectors(norm2_over_s, lam, dedupe):
    """J copies of x: G = c·11ᵀ/J has one eigenvalue c, so N_λ = c/(c+λ), c = exp(‖x‖²/√d)."""
    d, J = 16, 40
    x = torch.randn(d, dtype=torch.float64)
    x = x / x.norm() * math.sqrt(norm2_over_s * math.sqrt(d))
    got = degrees_of_freedom(x.expand(J, d), lam, dedupe=dedupe)
    log_c = norm2_over_s
    expected = 1.0 / (1.0 + math.exp(math.log(lam) - log_c))
    assert float(got) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("J", [2, 7, 16])
@pytest.mark.parametrize("r2_over_s", [0.7, 5.0, 120.0])
@pytest.mark.parametrize("lam", [2.0**-8, 0.5, 2.0**60])
def test_orthogonal_vectors(J, r2_over_s, lam):
    """J ≤ d orthogonal vectors of norm r: G = ((c−1)I + 11ᵀ)/J, N = a/(a+λ) + (J−1)·b/(b+λ)."""
    d = 16
    x = _orthogonal(J, d, math.sqrt(r2_over_s * math.sqrt(d)))
    c = math.exp(r2_over_s)
    a, b = (c - 1 + J) / J, (c - 1) / J
    expected = a / (a + lam) + (J - 1) * b / (b + lam)
    assert float(degrees_of_freedom(x, lam)) == pytest.approx(expected, rel=1e-8, abs=1e-8)


def test_mixed_norms_beyond_eigvalsh_precision():
    """Orthogonal vectors with ‖x‖²/√d of 150 and 10 and λ = e^80: a plain float64 eigendecomposition puts
    λ below its noise floor (e^150·eps ≈ e^113); the factorised form matches the exact Sherman–Morrison value."""
    d, J = 32, 32
    r2 = torch.tensor([150.0] * 16 + [10.0] * 16, dtype=torch.float64)
    x = _orthogonal(J, d, 1.0) * torch.sqrt(r2 * math.sqrt(d)).unsqueeze(-1)
    lam = math.exp(80.0)
    # G + λI = D0 + uuᵀ, D0 = diag((c_i − 1)/J + λ), u = 1/√J  (exact: G_ij = 1/J off the diagonal)
    d0 = (torch.exp(r2) - 1) / J + lam
    u = torch.full((J,), 1 / math.sqrt(J), dtype=torch.float64)
    trace_inv = (1 / d0).sum() - (u * u / d0**2).sum() / (1 + (u * u / d0).sum())
    expected = J - lam * float(trace_inv)
    assert float(degrees_of_freedom(x, lam)) == pytest.approx(expected, rel=1e-9)
    assert abs(float(dof_eigvalsh(x, lam)) - expected) > 0.5  # why the factorised form exists


def test_matches_eigvalsh_where_reliable():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 200, 16, generator=g, dtype=torch.float64) * 0.8
    for lam in (1e-3, 0.05, 1.0):
        torch.testing.assert_close(degrees_of_freedom(x, lam), dof_eigvalsh(x, lam), rtol=1e-7, atol=1e-7)


def test_monotone_in_lambda_and_bounded():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(150, 8, generator=g) * torch.linspace(0.5, 6, 150).unsqueeze(-1)
    values = [float(degrees_of_freedom(x, 2.0**k)) for k in range(-10, 80, 6)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert 0 < values[-1] < values[0] <= 150


def test_relative_lambda_is_invariant_to_gram_scale():
    """x' = [α·x, t] with α² = √(d+1)/√d gives G' = e^{t²/√(d+1)}·G exactly: a relative ridge gives the same DoF,
    an absolute one saturates."""
    g = torch.Generator().manual_seed(3)
    d, J = 16, 120
    x = torch.randn(J, d, generator=g, dtype=torch.float64)
    log_c = 60.0
    alpha = (math.sqrt(d + 1) / math.sqrt(d)) ** 0.5
    shifted = torch.cat([x * alpha, torch.full((J, 1), math.sqrt(log_c * math.sqrt(d + 1)), dtype=torch.float64)], -1)
    torch.testing.assert_close(log_gram(shifted), log_gram(x) + log_c)
    for mode in ("trace", "max_eigenvalue"):
        a, b = degrees_of_freedom(x, 0.1, relative_to=mode), degrees_of_freedom(shifted, 0.1, relative_to=mode)
        assert float(a) == pytest.approx(float(b), rel=1e-7)
        assert 1 < float(a) < 0.9 * J
    assert float(degrees_of_freedom(shifted, 1.0)) > 0.99 * J > float(degrees_of_freedom(x, 1.0))
    # the trace reference is exactly tr(G)/J
    lam_abs = 1e-3 * float(torch.exp(torch.logsumexp(log_gram(x).diagonal(), 0) - math.log(J)))
    assert float(degrees_of_freedom(x, 1e-3, relative_to="trace")) == pytest.approx(
        float(degrees_of_freedom(x, lam_abs)), rel=1e-10
    )


def test_batched_layer_and_max_over_heads():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 64, 8, generator=g) * torch.tensor([0.5, 1.0, 2.0]).view(3, 1, 1, 1)
    heads = degrees_of_freedom(x, 0.1)
    assert heads.shape == (3, 2)
    torch.testing.assert_close(heads[1, 0], degrees_of_freedom(x[1, 0], 0.1))
    torch.testing.assert_close(layer_dof(heads), heads.amax(-1))


def test_paper_gpt2_allocation():
    """Paper Table 2 (GPT-2, C = 64): per-layer DoF maxima → dims."""
    dof = [150, 173.8, 24.5, 39.8, 42.1, 66.6, 107.4, 33, 24.9, 29.9, 43.2, 39.8]
    dims = allocate_feature_dims(dof, 64, "dof")
    assert dims == [149, 172, 24, 39, 42, 66, 106, 33, 25, 30, 43, 39]
    assert sum(dims) == 12 * 64
    assert allocate_feature_dims(dof, 64, "dof_clip") == [min(m, 64) for m in dims]
    assert allocate_feature_dims(dof, 64, "fix") == [64] * 12


def test_allocation_multiple_of_keeps_budget():
    dof = [150, 173.8, 24.5, 39.8, 42.1, 66.6, 107.4, 33, 24.9, 29.9, 43.2, 39.8]
    dims = allocate_feature_dims(dof, 64, "dof", multiple_of=16)
    assert all(m % 16 == 0 and m >= 16 for m in dims) and sum(dims) == 12 * 64
    tiny = allocate_feature_dims([1000, 1, 1, 1], 8, "dof", min_dim=2, exact_budget=True)
    assert min(tiny) == 2 and sum(tiny) == 32


def test_degenerate_allocation_warns():
    with pytest.warns(DegenerateAllocationWarning, match="uniform"):
        allocate_feature_dims([100.0, 101.0, 99.5], 64, "dof")
    with pytest.warns(DegenerateAllocationWarning, match="saturated"):
        allocate_feature_dims([950.0, 10.0], 64, "dof", num_samples=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        allocate_feature_dims([100.0, 10.0], 64, "dof", num_samples=1024)


def test_select_lambda_hits_target():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 2, 96, 8, generator=g) * torch.tensor([0.5, 1.0, 2.0, 3.0]).view(4, 1, 1, 1)
    lam = select_lambda(x, 0.3, search_samples=None, tolerance=0.002)
    frac = float(layer_dof(degrees_of_freedom(x, lam)).mean()) / 96
    assert frac == pytest.approx(0.3, abs=0.003)
    dims = allocate_feature_dims(layer_dof(degrees_of_freedom(x, lam)), 8, "dof", num_samples=96)
    assert len(dims) == 4 and dims[0] < dims[-1]  # larger norms → more DoF → more features


def test_select_lambda_raises_its_bracket_for_a_kernel_of_large_scale():
    """q/k of large norm (Gemma 3's normed heads: logits of hundreds of nats) put the target λ far above 2^400, the
    default bracket's end: the search raises it (N_λ falls monotonically in λ) and still hits the target."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 2, 64, 16, generator=g) * 10.0  # |x|² ≈ 1600: Gram entries up to e^400 ≈ 2^580
    lam = select_lambda(x, 0.25, search_samples=None, tolerance=0.002)
    assert math.log2(lam) > 400
    assert float(layer_dof(degrees_of_freedom(x, lam)).mean()) / 64 == pytest.approx(0.25, abs=0.003)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: degrees_of_freedom(torch.randn(5, 4), 0.0), "lam"),
        (lambda: degrees_of_freedom(torch.randn(5, 4), float("nan")), "lam"),
        (lambda: degrees_of_freedom(torch.randn(1, 4), 1.0), "J"),
        (lambda: degrees_of_freedom(torch.full((5, 4), float("nan")), 1.0), "NaN"),
        (lambda: degrees_of_freedom(torch.randn(5, 4), 1.0, relative_to="median"), "relative_to"),
        (lambda: allocate_feature_dims([1.0, 2.0], 64, "uniform"), "strategy"),
        (lambda: allocate_feature_dims([1.0, -2.0], 64), "finite, >= 0"),
        (lambda: allocate_feature_dims([0.0, 0.0], 64), "not all zero"),
        (lambda: allocate_feature_dims([1.0, 2.0], 0), "head_size"),
        (lambda: allocate_feature_dims([], 64), "empty"),
    ],
)
def test_invalid_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
