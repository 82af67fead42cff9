"""Feature maps φ: ``(B, H, T, D) → (B, H, T, M)``, one per file."""

from lit_dof.attention.feature_maps.base import FeatureMap, orthogonal_gaussian
from lit_dof.attention.feature_maps.dijiang import DiJiangFeatureMap
from lit_dof.attention.feature_maps.hedgehog import HedgehogFeatureMap
from lit_dof.attention.feature_maps.prf import LearnedPRF, PerformerFeatureMap
from lit_dof.attention.feature_maps.registry import register_feature_map, registered_feature_map

for _cls in (LearnedPRF, PerformerFeatureMap, DiJiangFeatureMap, HedgehogFeatureMap):
    # the recorded "module.QualName" plus the public paths the configs use (lit_dof.attention.LearnedPRF)
    register_feature_map(_cls, aliases=(f"lit_dof.attention.{_cls.__name__}", f"{__name__}.{_cls.__name__}"))
del _cls

__all__ = [
    "DiJiangFeatureMap",
    "FeatureMap",
    "HedgehogFeatureMap",
    "LearnedPRF",
    "PerformerFeatureMap",
    "orthogonal_gaussian",
    "register_feature_map",
    "registered_feature_map",
]
