"""Causal linear attention over log-features: the float64 reference (``naive``), the chunked training / prefill
form (``chunked``), the token-by-token decoding form (``recurrent``), their state (``state``) and the same op on
flash-linear-attention's kernels (``fla``)."""
