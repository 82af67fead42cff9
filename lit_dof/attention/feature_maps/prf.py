"""Positive random features: the paper's learned map and the FAVOR+ (Performer) baseline.

φ(x; z) = exp(zᵀx/d^¼ − ‖x‖²/(2√d)), K̂(x, y) = (1/M) Σ_i α_i φ(x; z_i) φ(y; z_i)     (METHOD.md §1)

E_z[φ(x;z)φ(y;z)] = exp(xᵀy/√d) for z ~ N(0, I_d) (Choromanski et al. 2021, Lemma 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lit_dof.attention.feature_maps.base import FeatureMap, exponential_log_features, orthogonal_gaussian
from lit_dof.precision import fp32_region


class _PositiveRandomFeatures(FeatureMap):
    """Shared evaluation of log φ(x; z) with per-head z ``(H, M, d)`` and log-weights ``(H, M)``."""

    z: Tensor

    def _log_alpha(self) -> Tensor | None:
        return None

    def _projection(self) -> Tensor:
        return self.z.transpose(-1, -2) * self.head_dim**-0.25  # (H, d, M)

    def _bias(self, device: torch.device) -> Tensor:
        """½ log α − ½ log M, ``(H or 1, 1, M)``: √(α/M) on each side gives K̂ = (1/M) Σ α φφ."""
        bias = torch.full(
            (1, 1, self.feature_dim), -0.5 * math.log(self.feature_dim), dtype=torch.float32, device=device
        )
        log_alpha = self._log_alpha()
        return bias if log_alpha is None else bias + 0.5 * log_alpha.unsqueeze(-2)

    def _log_features(self, x: Tensor, drop_row_constant: bool) -> Tensor:
        return exponential_log_features(x, self._projection(), self._bias(x.device), with_norm=not drop_row_constant)

    @fp32_region()
    def attention_log_features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """As :meth:`FeatureMap.attention_log_features`, with both sides' per-feature bias moved to the keys:
        the queries cost one ``bmm``."""
        q, k = self._prepare_input(q), self._prepare_input(k)
        projection = self._projection()
        log_q = exponential_log_features(q, projection, None, with_norm=False)
        log_k = exponential_log_features(k, projection, 2.0 * self._bias(k.device), with_norm=True)
        return log_q, log_k


class LearnedPRF(_PositiveRandomFeatures):
    """The paper's learned positive random features (Nishikawa et al. 2025, §3; METHOD.md §1).

    Parameters per head: ``z`` ``(H, M, d)``, initialised from orthogonal Gaussian blocks, and
    ``log_alpha`` ``(H, M)``, initialised to 0 (α = exp(log_alpha) = 1). α is parameterised in log space so
    it stays positive; the paper's learning rates (z 0.02, α 0.2) apply to ``z`` and ``log_alpha``.

    Args:
        head_dim, num_heads, feature_dim: d, H, M (see :class:`FeatureMap`).
        seed: seed for the initial draw of z (``None``: the global RNG).
        check_inputs: reject NaN input.

    Shapes: ``(B, H, T, d) → (B, H, T, M)``.

    Raises:
        ValueError: non-positive sizes.
    """

    def __init__(
        self, head_dim: int, num_heads: int, feature_dim: int, *, seed: int | None = None, check_inputs: bool = True
    ) -> None:
        super().__init__(head_dim, num_heads, feature_dim, seed=seed, check_inputs=check_inputs)
        self.z = nn.Parameter(orthogonal_gaussian(num_heads, feature_dim, head_dim, self.seeded_generator()))
        self.log_alpha = nn.Parameter(torch.zeros(num_heads, feature_dim, dtype=torch.float32))

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """``z`` in group ``"z"`` and ``log_alpha`` in ``"log_alpha"`` (the paper's two learning rates).

        Returns:
            ``{"z": [z], "log_alpha": [log_alpha]}``.
        """
        return {"z": [self.z], "log_alpha": [self.log_alpha]}

    def _log_alpha(self) -> Tensor:
        return self.log_alpha

    @property
    def alpha(self) -> Tensor:
        """The positive feature weights α, ``(H, M)``."""
        return self.log_alpha.exp()

    def _resize(self, feature_dim: int) -> None:
        keep = min(feature_dim, self.feature_dim)
        fresh = orthogonal_gaussian(self.num_heads, feature_dim, self.head_dim, self.seeded_generator())
        z = fresh.to(self.z)
        z[:, :keep] = self.z.detach()[:, :keep]
        log_alpha = torch.zeros(self.num_heads, feature_dim).to(self.log_alpha)
        log_alpha[:, :keep] = self.log_alpha.detach()[:, :keep]
        self.z = nn.Parameter(z, requires_grad=self.z.requires_grad)
        self.log_alpha = nn.Parameter(log_alpha, requires_grad=self.log_alpha.requires_grad)


class PerformerFeatureMap(_PositiveRandomFeatures):
    """FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers", §2.3–2.4): fixed orthogonal
    random z, α = 1, nothing trained. K̂ is an unbiased estimator of exp(xᵀy/√d).

    Args:
        head_dim, num_heads, feature_dim: d, H, M.
        redraw_interval: in training mode, draw fresh z every this many forward calls (0: never).
        seed: seed for the draws (``None``: the global RNG).
        check_inputs: reject NaN input.

    ``z`` is a buffer (saved in checkpoints, not a parameter).

    Raises:
        ValueError: non-positive sizes or a negative ``redraw_interval``.
    """

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        feature_dim: int,
        *,
        redraw_interval: int = 0,
        seed: int | None = None,
        check_inputs: bool = True,
    ) -> None:
        super().__init__(head_dim, num_heads, feature_dim, seed=seed, check_inputs=check_inputs)
        if redraw_interval < 0:
            raise ValueError(f"redraw_interval must be >= 0 (0 disables redrawing), got {redraw_interval}")
        self.redraw_interval = redraw_interval
        self._generator = self.seeded_generator()  # one stream for the initial draw and every redraw
        self._calls = 0
        self.register_buffer("z", orthogonal_gaussian(num_heads, feature_dim, head_dim, self._generator))

    def config_kwargs(self) -> dict:
        """``{"redraw_interval": ...}``; the projection z is a buffer, restored from the checkpoint."""
        return {"redraw_interval": self.redraw_interval}

    def redraw(self) -> None:
        """Replace z by a fresh orthogonal Gaussian draw (same shape, device and dtype)."""
        self.z.copy_(orthogonal_gaussian(self.num_heads, self.feature_dim, self.head_dim, self._generator))

    def maybe_redraw(self) -> None:
        """Count a training step and redraw z every ``redraw_interval`` steps (call once per step, not per
        forward, so that queries and keys of a step see the same z)."""
        if self.training and self.redraw_interval:
            self._calls += 1
            if self._calls % self.redraw_interval == 0:
                self.redraw()

    def _resize(self, feature_dim: int) -> None:
        self.z = orthogonal_gaussian(self.num_heads, feature_dim, self.head_dim, self._generator).to(self.z)
