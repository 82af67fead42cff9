"""Causal linear attention as a module: a feature map φ plus the chunked / recurrent kernels, with GQA.

GQA policy. With Hq query heads and Hk key/value heads (group G = Hq/Hk) the feature maps can be
  * shared per KV head (``feature_map.num_heads == Hk``, the default): a group's queries and its key use
    the same φ, the key features are computed once per KV head, and the recurrent state is
    ``(B, Hk, M, D)`` — GQA's G-fold saving of decode memory survives linearisation;
  * per query head (``feature_map.num_heads == Hq``): more expressive (each query head gets its own kernel
    approximation) but the keys must be mapped G times and the state is ``(B, Hq, M, D)``.
The default is the shared form because lit-dof's purpose is cheap long-context inference: decode
memory and key-feature cost are what linearisation is for, and the DoF (METHOD.md §2) is estimated on
the pooled queries and keys of a KV group anyway. Pass a per-query-head map to get the other form.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from lit_dof.attention._validation import check_attention_call, check_positive_int
from lit_dof.attention.feature_maps.base import FeatureMap
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE, accumulate_state, chunked_linear_attention
from lit_dof.attention.ops.linear.recurrent import recurrent_linear_attention
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE, LinearAttentionState
from lit_dof.precision import Float32Parameters

FeatureMapFactory = Callable[[int, int, int], FeatureMap]
"""``(head_dim, num_heads, feature_dim) -> FeatureMap``; every feature-map class is one."""


class CausalLinearAttention(Float32Parameters):
    """Causal linear attention ``softmax(QKᵀ/√d)V ≈ norm(φ(Q)φ(K)ᵀ)V`` for one layer (METHOD.md §1).

    Args:
        feature_map: φ with ``num_heads`` equal to ``num_kv_heads`` (shared per KV head) or ``num_heads``
            (per query head).
        num_heads: Hq, query heads.
        num_kv_heads: Hk, key/value heads (``None``: equal to ``num_heads``, i.e. no GQA).
        chunk_size: chunk size C of the parallel form.
        decode_max_tokens: segments with a state and at most this many tokens use the recurrent form;
            longer ones the chunked form (both exact; the recurrent one has less overhead for a token).

    Raises:
        ValueError: ``num_heads`` not a multiple of ``num_kv_heads``, or a feature map whose head count is
            neither of them.
    """

    def __init__(
        self,
        feature_map: FeatureMap,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        decode_max_tokens: int = 1,
    ) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads or num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if feature_map.num_heads not in (self.num_kv_heads, self.num_heads):
            raise ValueError(
                f"feature_map.num_heads must equal num_kv_heads ({self.num_kv_heads}, shared maps) or num_heads "
                f"({self.num_heads}, per-query-head maps), got {feature_map.num_heads}"
            )
        self.feature_map = feature_map
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.decode_max_tokens = decode_max_tokens

    @classmethod
    def from_factory(
        cls,
        factory: FeatureMapFactory,
        head_dim: int,
        feature_dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        share_kv_maps: bool = True,
        **kwargs,
    ) -> "CausalLinearAttention":
        """Build the feature map with ``factory(head_dim, H, feature_dim)`` (H = Hk if ``share_kv_maps``)."""
        heads = (num_kv_heads or num_heads) if share_kv_maps else num_heads
        return cls(factory(head_dim, heads, feature_dim), num_heads, num_kv_heads, **kwargs)

    @property
    def shares_kv_maps(self) -> bool:
        """True when φ is shared by the query heads of a KV group (state ``(B, Hk, M, D)``)."""
        return self.feature_map.num_heads == self.num_kv_heads

    def activation_bytes(self, batch: int, tokens: int) -> int:
        """Bytes the chunked form keeps for backward on ``batch`` sequences of ``tokens`` tokens: float32 copies of
        q ``(B, Hq, T, d)`` and k ``(B, Hk, T, d)``, three ``(…, T, M)`` tensors of each (log-features, features and
        a working copy), the intra-chunk score blocks (2 × T·C per query head) and the per-chunk prefix states
        ``(B, Hk, ⌈T/C⌉, M, d)`` with their key sums.

        Args:
            batch: B, sequences.
            tokens: T, tokens per sequence.

        Returns:
            bytes (a closed-form count, for ``lit-dof plan``).
        """
        heads, kv, c = self.num_heads, self.num_kv_heads, self.chunk_size
        d, m = self.feature_map.head_dim, self.feature_map.feature_dim
        qk = tokens * (heads + kv) * d + 3 * tokens * (heads + kv) * m
        return 4 * batch * (qk + 2 * heads * tokens * min(c, tokens) + kv * -(-tokens // c) * m * (d + 1))

    def extra_repr(self) -> str:
        """Query heads, KV heads (GQA) and the kernel's chunk size, for ``print(module)``."""
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, chunk_size={self.chunk_size}"

    def log_features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Log-features of queries and keys as the kernels consume them (METHOD.md §1).

        Args:
            q: ``(B, Hq, T, d)`` queries.
            k: ``(B, Hk, Tk, d)`` keys.

        Returns:
            ``log φ(q)`` ``(B, Hq, T, M)`` and ``log φ(k)`` ``(B, Hk, Tk, M)`` for maps shared per KV head (a
            group's queries go through their KV head's map) or ``(B, Hq, Tk, M)`` for per-query-head maps.
            Row constants of φ(q) that cancel in attention may be dropped (see ``attention_log_features``).
        """
        return self.grouped_log_features(q, k, self.feature_map.attention_log_features)

    def grouped_log_features(
        self, q: Tensor, k: Tensor, features: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        """Apply ``features(queries, keys)`` in the layer's GQA layout: maps shared per KV head see a group's
        queries as one ``(B, Hk, group · T, d)`` sequence (outputs reshaped back to ``(B, Hq, T, M)``); per-query-head
        maps see each KV head's keys repeated for its group.

        Args:
            q: ``(B, Hq, T, d)`` queries.
            k: ``(B, Hk, Tk, d)`` keys.
            features: ``(queries, keys) -> (log φ(queries), log φ(keys))`` of the layer's map, per map head.

        Returns:
            ``(B, Hq, T, M)`` and ``(B, Hk, Tk, M)`` (shared maps) or ``(B, Hq, Tk, M)`` (per-query-head maps).
        """
        B, Hq, T, d = q.shape
        group = self.num_heads // self.num_kv_heads
        if self.shares_kv_maps:
            log_q, log_k = features(q.reshape(B, self.num_kv_heads, group * T, d), k)
            return log_q.view(B, Hq, T, -1), log_k
        return features(q, k.repeat_interleave(group, dim=1))

    def check_call(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> int:
        """Validate a call's shapes against the layer; returns Tk.

        Raises:
            ValueError: q/k/v of the wrong rank or head counts, Tk < T, or a padding mask that is not ``(B, Tk)``.
        """
        return check_attention_call(q, k, v, key_padding_mask, self.num_heads, self.num_kv_heads)

    @property
    def needs_rotary(self) -> bool:
        """Whether :meth:`forward` needs the call's rotary ``(cos, sin)``; ``False`` for the pure linear layer."""
        return False

    @property
    def far_gated(self) -> bool:
        """Whether a forget gate of the layer reads the values, so its losses need them; ``False`` for the pure
        linear layer."""
        return False

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: LinearAttentionState | None = None,
        key_padding_mask: Tensor | None = None,
        *,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, LinearAttentionState]:
        """Attend causally, continuing from ``state`` if given.

        The T queries are the *last* T of the Tk ≥ T keys: a longer key sequence (a softmax KV cache handed
        to a linear layer) is a prefix whose keys are folded into the state first, without outputs.

        Args:
            q: ``(B, Hq, T, d)`` queries (after RoPE), already scaled so that the softmax logits are qᵀk/√d.
            k: ``(B, Hk, Tk, d)`` keys, Tk ≥ T.
            v: ``(B, Hk, Tk, D)`` values.
            state: recurrent state after the tokens before these keys, or ``None``.
            key_padding_mask: ``(B, Tk)`` bool, False for padding keys (they get φ = 0 and never contribute).
            rotary: the call's rotary ``(cos, sin)``; unused here (these maps see post-RoPE q/k), taken so that every
                linear layer has one call signature (:attr:`needs_rotary`).

        Returns:
            ``(y, state)`` with ``y`` ``(B, Hq, T, D)`` in v's dtype and the float32 state after the last token
            (``(B, Hk, M, D)`` for shared maps, ``(B, Hq, M, D)`` per query head). Rows of padding queries
            are finite but meaningless.

        Raises:
            ValueError: shapes inconsistent with the layer, Tk < T, or NaN input.
        """
        B, Hq, T, d = q.shape
        Tk = self.check_call(q, k, v, key_padding_mask)
        if not self.shares_kv_maps:
            v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        P = Tk - T  # prefix tokens without queries
        log_q, log_k = self.log_features(q, k)
        if key_padding_mask is not None:
            log_k = log_k.float().masked_fill(~key_padding_mask[:, None, :, None].to(torch.bool), EMPTY_LOG_SCALE)
        if P:
            state = accumulate_state(log_k[:, :, :P], v[:, :, :P], initial_state=state)
            log_k, v = log_k[:, :, P:], v[:, :, P:]
        if state is not None and T <= self.decode_max_tokens:
            return recurrent_linear_attention(log_q, log_k, v, initial_state=state, check_inputs=False)
        return chunked_linear_attention(
            log_q, log_k, v, chunk_size=self.chunk_size, initial_state=state, check_inputs=False
        )
