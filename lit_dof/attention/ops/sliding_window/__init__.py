"""Sliding-window + linear attention: the float64 reference (``naive``), the combined kernel (``chunked``), its exact
window + sinks part in PyTorch (``softmax``) and by ``flex_attention`` (``flex``)."""
