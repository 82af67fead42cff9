"""Attention kernels: functions of tensors, no parameters (fla's ``ops`` layout).

- :mod:`~lit_dof.attention.ops.linear`: causal linear attention over log-features (float64 reference, chunked
  training / prefill form, recurrent decoding form, the state they carry, flash-linear-attention's kernels);
- :mod:`~lit_dof.attention.ops.sliding_window`: exact softmax over a sliding window and sink tokens with a linear
  far term (reference, the combined kernel, the window part in PyTorch and by ``flex_attention``);
- :mod:`~lit_dof.attention.ops.delta_rule`: the gated delta rule, a memory that overwrites (float64 sequential
  reference, chunked WY / UT form);
- :mod:`~lit_dof.attention.ops.rotary`: undoing a teacher's rotary position embedding.
"""
