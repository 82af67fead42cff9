"""Feature maps φ: ``(B, H, T, D) → (B, H, T, M)``, one per file."""

from lit_dof.attention.feature_maps.base import FeatureMap, orthogonal_gaussian
from lit_dof.attention.feature_maps.dijiang import DiJiangFeatureMap
from lit_dof.attention.feature_maps.hedgehog import HedgehogFeatureMap
from lit_dof.attention.feature_maps.prf import LearnedPRF, PerformerFeatureMap

__all__ = [
    "DiJiangFeatureMap",
    "FeatureMap",
    "HedgehogFeatureMap",
    "LearnedPRF",
    "PerformerFeatureMap",
    "orthogonal_gaussian",
]
