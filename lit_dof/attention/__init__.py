"""Linear and sliding-window + linear attention: feature maps φ (``feature_maps``), kernels (``ops``: float64
references, chunked training / prefill forms, recurrent decoding forms; functions of tensors) and the layers built
on them (``layers``: modules with parameters). The public names are re-exported here.

Shapes throughout: B batch, Hq query heads, Hk key/value heads, T tokens, d head size, M feature
dimension, D value size, C chunk size. Kernels take *log*-features (see :mod:`lit_dof.attention.ops.linear.chunked`
for why).
"""

from lit_dof.attention.feature_maps import (
    DiJiangFeatureMap,
    FeatureMap,
    HedgehogFeatureMap,
    LearnedPRF,
    PerformerFeatureMap,
    register_feature_map,
)
from lit_dof.attention.layers.linear import CausalLinearAttention, FeatureMapFactory
from lit_dof.attention.layers.sliding_window import SlidingWindowLinearAttention
from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.attention.ops.linear.chunked import accumulate_state, chunked_linear_attention
from lit_dof.attention.ops.linear.naive import log_kernel_matrix, naive_linear_attention
from lit_dof.attention.ops.linear.recurrent import recurrent_linear_attention
from lit_dof.attention.ops.linear.state import LinearAttentionState
from lit_dof.attention.ops.sliding_window.chunked import SlidingWindowState, sliding_window_linear_attention
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention

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
