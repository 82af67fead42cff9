"""DiJiang's frequency-domain kernelisation (Chen et al. 2024, "DiJiang: Efficient Large Language Models
through Compact Kernelization", ICML, §3.2 "weighted DCT feature map"; METHOD.md §5).

DiJiang maps a vector into the frequency domain with the discrete cosine transform C, scales each
frequency by a weight from a quasi-Monte-Carlo (QMC) draw, exponentiates, and multiplies by a learnable
diagonal D: φ(x) = D · exp(T C x). We keep the positive-random-feature normalisation of METHOD.md §1 so
K̂ is on the scale of exp(xᵀy/√d)::

    log φ_f(x) = t_f s_f c_{r(f)}ᵀx / d^¼ − ‖x‖²/(2√d) + log D_f − ½ log M

* c_r: row r of the orthonormal DCT-II matrix (d×d); feature f uses row r(f) = f mod d, so any M works;
* s_f = (−1)^{⌊f/d⌋}: successive blocks of d features use antithetic (negated) directions;
* t_f: QMC radii — scrambled Sobol points pushed through the χ_d inverse CDF (Wilson–Hilferty), so that
  t_f c_r has the norm distribution of an N(0, I_d) draw, as in orthogonal random features;
* D_f = exp(log_weight_f): learnable, per head, initialised to 1.

Unlike DiJiang's public code (quadratic, overflowing on long inputs) this map feeds the causal linear-time
kernels, which stabilise in log space.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lit_dof.attention.feature_maps.base import FeatureMap, exponential_log_features
from lit_dof.precision import fp32_region


def dct_matrix(size: int) -> Tensor:
    """Orthonormal DCT-II matrix, ``(size, size)``: row k is the k-th cosine basis vector."""
    n = torch.arange(size, dtype=torch.float64)
    k = n.unsqueeze(1)
    mat = torch.cos(math.pi * (n + 0.5) * k / size) * math.sqrt(2.0 / size)
    mat[0] /= math.sqrt(2.0)
    return mat.float()


@fp32_region()  # SobolEngine keeps its first point in the default dtype: never bfloat16
def qmc_chi_radii(count: int, dof: int, seed: int) -> Tensor:
    """``count`` quasi-Monte-Carlo quantiles of the χ distribution with ``dof`` degrees of freedom.

    Scrambled Sobol points u ∈ (0, 1) → z = Φ⁻¹(u) → χ²_dof quantile by the Wilson–Hilferty transform
    dof·(1 − 2/(9 dof) + z √(2/(9 dof)))³ → square root. Returns ``(count,)`` float32, the same under a
    half default dtype.
    """
    engine = torch.quasirandom.SobolEngine(dimension=1, scramble=True, seed=seed)
    u = engine.draw(count, dtype=torch.float64).squeeze(-1).clamp(1e-6, 1 - 1e-6)
    z = torch.special.ndtri(u)
    c = 2.0 / (9.0 * dof)
    chi2 = dof * (1.0 - c + z * math.sqrt(c)).clamp_min(1e-3) ** 3
    return chi2.sqrt().float()


class DiJiangFeatureMap(FeatureMap):
    """DCT-based positive feature map with QMC radii and a learnable diagonal (DiJiang, §3.2).

    Args:
        head_dim, num_heads, feature_dim: d, H, M (any M ≥ 1, not only M = d).
        seed: seed of the scrambled Sobol sequence.
        check_inputs: reject NaN input.

    Parameters: ``log_weight`` ``(H, M)`` (the diagonal D in log space). Buffers: ``projection`` ``(M, d)``.

    Shapes: ``(B, H, T, d) → (B, H, T, M)``.

    Raises:
        ValueError: non-positive sizes.
    """

    def __init__(
        self, head_dim: int, num_heads: int, feature_dim: int, *, seed: int = 0, check_inputs: bool = True
    ) -> None:
        super().__init__(head_dim, num_heads, feature_dim, seed=seed, check_inputs=check_inputs)
        self.register_buffer("projection", self._projection(feature_dim))
        self.log_weight = nn.Parameter(torch.zeros(num_heads, feature_dim, dtype=torch.float32))

    def _projection(self, feature_dim: int) -> Tensor:
        d = self.head_dim
        rows = torch.arange(feature_dim)
        signs = 1.0 - 2.0 * ((rows // d) % 2).float()  # antithetic blocks
        radii = qmc_chi_radii(feature_dim, d, self.seed)
        return dct_matrix(d)[rows % d] * (signs * radii).unsqueeze(-1)  # (M, d)

    def _log_features(self, x: Tensor, drop_row_constant: bool) -> Tensor:
        projection = (self.projection.t() * self.head_dim**-0.25).unsqueeze(0)  # (1, d, M)
        bias = self.log_weight.unsqueeze(-2) - 0.5 * math.log(self.feature_dim)  # (H, 1, M)
        return exponential_log_features(x, projection, bias, with_norm=not drop_row_constant)

    def _resize(self, feature_dim: int) -> None:
        keep = min(feature_dim, self.feature_dim)
        self.projection = self._projection(feature_dim).to(self.projection)
        log_weight = torch.zeros(self.num_heads, feature_dim).to(self.log_weight)
        log_weight[:, :keep] = self.log_weight.detach()[:, :keep]
        self.log_weight = nn.Parameter(log_weight, requires_grad=self.log_weight.requires_grad)
