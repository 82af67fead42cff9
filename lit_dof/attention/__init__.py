"""Linear attention: feature maps φ, the causal kernels (naive reference, chunked, recurrent) and the layer.

Shapes throughout: B batch, Hq query heads, Hk key/value heads, T tokens, d head size, M feature
dimension, D value size, C chunk size. Kernels take *log*-features (see ``chunked.py`` for why).
"""

from lit_dof.attention.chunked import accumulate_state, chunked_linear_attention
from lit_dof.attention.feature_maps import (
    DiJiangFeatureMap,
    FeatureMap,
    HedgehogFeatureMap,
    LearnedPRF,
    PerformerFeatureMap,
    register_feature_map,
)
from lit_dof.attention.layer import CausalLinearAttention, FeatureMapFactory
from lit_dof.attention.naive import log_kernel_matrix, naive_linear_attention, naive_sliding_window_attention
from lit_dof.attention.recurrent import recurrent_linear_attention
from lit_dof.attention.sliding_layer import SlidingWindowLinearAttention
from lit_dof.attention.sliding_window import SlidingWindowState, sliding_window_linear_attention
from lit_dof.attention.state import LinearAttentionState
from lit_dof.attention.window_options import SlidingWindow

__all__ = [
    "CausalLinearAttention",
    "DiJiangFeatureMap",
    "FeatureMap",
    "FeatureMapFactory",
    "HedgehogFeatureMap",
    "LearnedPRF",
    "LinearAttentionState",
    "PerformerFeatureMap",
    "SlidingWindow",
    "SlidingWindowLinearAttention",
    "SlidingWindowState",
    "accumulate_state",
    "chunked_linear_attention",
    "log_kernel_matrix",
    "naive_linear_attention",
    "naive_sliding_window_attention",
    "recurrent_linear_attention",
    "register_feature_map",
    "sliding_window_linear_attention",
]
