"""Sliding-window + linear attention: the float64 reference (``naive``), the combined kernel (``chunked``), its exact
window + sinks part in PyTorch (``softmax``) and by ``flex_attention`` (``flex``), and which far tokens an exact far
cache keeps (``far_cache``: their scores and the running top K) and how they enter the attention and a decoding
state (``far_cache_state``)."""
