"""Hedgehog feature map (Zhang et al. 2024, "The Hedgehog & the Porcupine: Expressive Linear Attentions
with Softmax Mimicry", ICLR, §4.1): φ(x) = [softmax(xW) ⊕ softmax(−xW)], W learned per head.

The two softmaxes make φ positive and bounded and let a linear layer mimic the spiky, monotone
attention of softmax. K̂ = φ(q)·φ(k) is not on the scale of exp(qᵀk/√d), but only normalised rows enter
attention, so that does not matter. Log-features are exact log-softmaxes (never −inf).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_dof.attention.feature_maps.base import FeatureMap, orthogonal_gaussian


class HedgehogFeatureMap(FeatureMap):
    """Hedgehog: ⌈M/2⌉ features softmax(xW) and ⌊M/2⌋ features softmax(−xW) (the first ⌊M/2⌋ columns).

    Args:
        head_dim, num_heads, feature_dim: d, H, M.
        seed: seed for the extra columns when ⌈M/2⌉ > d (``None``: global RNG).
        check_inputs: reject NaN input.

    Parameters: ``weight`` ``(H, d, ⌈M/2⌉)``, initialised to the identity in its first d columns (so
    initially φ is softmax over ±x, as in the paper) and to unit random directions beyond.

    Shapes: ``(B, H, T, d) → (B, H, T, M)``; M may be odd (one more positive than negative feature).

    Raises:
        ValueError: a head size, head count or feature dimension that is not a positive integer.
    """

    def __init__(
        self, head_dim: int, num_heads: int, feature_dim: int, *, seed: int | None = None, check_inputs: bool = True
    ) -> None:
        super().__init__(head_dim, num_heads, feature_dim, seed=seed, check_inputs=check_inputs)
        self.weight = nn.Parameter(self._init_weight(feature_dim))

    def _init_weight(self, feature_dim: int) -> Tensor:
        half = (feature_dim + 1) // 2
        d = self.head_dim
        eye = torch.eye(d, dtype=torch.float32).expand(self.num_heads, d, d)
        if half <= d:
            return eye[:, :, :half].clone()
        extra = orthogonal_gaussian(self.num_heads, half - d, d, self.seeded_generator())
        extra = extra / extra.norm(dim=-1, keepdim=True)  # (H, half − d, d)
        return torch.cat([eye, extra.transpose(-1, -2)], dim=-1)

    def _log_features(self, x: Tensor, drop_row_constant: bool) -> Tensor:
        proj = x @ self.weight.to(x.dtype)  # (B, H, T, ⌈M/2⌉)
        negative = self.feature_dim // 2
        return torch.cat([F.log_softmax(proj, dim=-1), F.log_softmax(-proj[..., :negative], dim=-1)], dim=-1)

    def _resize(self, feature_dim: int) -> None:
        weight = self._init_weight(feature_dim).to(self.weight)
        keep = min(weight.shape[-1], self.weight.shape[-1])
        weight[..., :keep] = self.weight.detach()[..., :keep]
        self.weight = nn.Parameter(weight, requires_grad=self.weight.requires_grad)
