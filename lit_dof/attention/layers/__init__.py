"""Attention layers: modules with parameters (feature maps φ, mixing weights, decay) around the kernels of
:mod:`lit_dof.attention.ops` — causal linear attention (``linear``), sliding-window + linear attention
(``sliding_window``, its options in ``window_options``) and per-head feature dimensions (``grouped``)."""
