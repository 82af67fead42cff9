"""The (gated) delta rule: a memory that overwrites what a key held instead of adding to it — the float64
sequential reference (``naive``) and the chunked training / prefill form (``chunked``)."""
