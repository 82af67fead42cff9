"""lit-dof: distil the softmax attention of a pretrained causal Transformer into linear attention whose
per-layer feature dimension follows the degrees of freedom of its attention kernel."""

__version__ = "0.1.0"
