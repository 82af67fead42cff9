"""Test doubles: an exact softmax "linear twin" that plugs into the surgery in place of linear attention.

It has the interface of :class:`lit_dof.attention.CausalLinearAttention` (``(q, k, v, state, key_padding)
-> (y, state)``) but computes exact causal softmax attention exp(qᵀk/√d) in float64 from the keys and
values it keeps as its "state". A linearised model with these twins must reproduce the teacher: that
checks projections, RoPE, GQA, scaling, padding and the cache plumbing independently of any feature map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class KVState:
    k: Tensor  # (B, Hk, P, d)
    v: Tensor  # (B, Hk, P, D)
    valid: Tensor  # (B, P) bool

    def index_select(self, dim, index):
        return KVState(
            self.k.index_select(dim, index), self.v.index_select(dim, index), self.valid.index_select(dim, index)
        )

    def repeat_interleave(self, repeats):
        return KVState(*(t.repeat_interleave(repeats, dim=0) for t in (self.k, self.v, self.valid)))

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))


class ExactSoftmaxTwin(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads

    def forward(self, q, k, v, state=None, key_padding_mask=None, *, rotary=None):
        B, Hq, T, d = q.shape
        valid = torch.ones(B, k.shape[2], dtype=torch.bool) if key_padding_mask is None else key_padding_mask.bool()
        if state is not None:
            k, v, valid = torch.cat([state.k, k], 2), torch.cat([state.v, v], 2), torch.cat([state.valid, valid], 1)
        G = Hq // self.num_kv_heads
        kk, vv = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
        S = k.shape[2]
        logits = q.double() @ kk.transpose(-1, -2) / math.sqrt(d)  # (B, Hq, T, S)
        causal = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        allowed = causal[None, None] & valid[:, None, None, :]
        logits = logits.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(logits, -1).nan_to_num(0.0)  # rows with no valid key (padding queries) → 0
        return (weights @ vv).to(v.dtype), KVState(k, v, valid)


def install_exact_twins(student) -> None:
    """Replace every linear twin of ``student`` by an :class:`ExactSoftmaxTwin`."""
    from lit_dof.teacher.families import attention_layers

    for layer in attention_layers(student.model):
        slot = getattr(layer.module, "lit_dof", None)
        if slot is not None and slot.linear is not None:
            slot.linear = ExactSoftmaxTwin(layer.num_heads, layer.num_kv_heads)
