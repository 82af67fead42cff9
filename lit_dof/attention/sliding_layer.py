"""Sliding-window + linear attention as a layer: exact softmax over the last ``window`` tokens (and the
first ``sink_tokens``), a feature map φ's linear attention over everything older (the kernel and its
equations: :mod:`lit_dof.attention.sliding_window`).

It is a :class:`~lit_dof.attention.CausalLinearAttention` (same feature map, GQA policy and call
signature), so students, hybrids, the caches and the distillation losses take it wherever they take the
pure linear layer; ``window = 0`` in the student configuration means that pure layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lit_dof.attention._validation import check_positive_int
from lit_dof.attention.feature_maps.base import FeatureMap
from lit_dof.attention.layer import CausalLinearAttention
from lit_dof.attention.sliding_window import SlidingWindowState, sliding_window_linear_attention


class SlidingWindowLinearAttention(CausalLinearAttention):
    """Causal attention with an exact sliding window (plus attention sinks) and a linear far term.

    Args:
        feature_map: φ of the far term (``num_heads`` = Hk for maps shared per KV head, or Hq).
        num_heads: Hq. num_kv_heads: Hk (``None``: Hq).
        window: w ≥ 1, tokens attended exactly, the query's own included.
        sink_tokens: s ≥ 0, first tokens of the sequence always attended exactly (attention sinks).
        far_term: include the linear far term; ``False`` leaves the window and sinks alone (a control).
        learn_mix: give each query head a trainable log-weight β of its far term (initialised to 0, i.e.
            the far terms count as the kernel estimates they are).
        far_decay: τ > 0 in tokens: weight the far terms by e^{−(p − w − t)/τ}, a decay with the distance past
            the window (λ = 1/τ per feature-map head; :mod:`lit_dof.attention.sliding_window`), so the far term
            reaches about τ tokens past the window at any context length; ``None`` (default): no decay.
        learn_decay: train the decay rates (log λ per feature-map head, initialised to ``log(1/far_decay)``);
            ``False`` keeps them fixed.
        chunk_size: chunk size of both parts' parallel forms.

    Raises:
        ValueError: ``window < 1``, ``sink_tokens < 0``, ``far_decay <= 0``, ``learn_decay`` without
            ``far_decay``, or a feature map / head layout the parent rejects.
    """

    def __init__(
        self,
        feature_map: FeatureMap,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        window: int = 64,
        sink_tokens: int = 0,
        far_term: bool = True,
        learn_mix: bool = True,
        far_decay: float | None = None,
        learn_decay: bool = False,
        chunk_size: int = 64,
        decode_max_tokens: int = 1,
    ) -> None:
        super().__init__(
            feature_map, num_heads, num_kv_heads, chunk_size=chunk_size, decode_max_tokens=decode_max_tokens
        )
        self.window = check_positive_int("window", window)
        if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
            raise ValueError(f"sink_tokens must be an integer >= 0, got {sink_tokens!r}")
        self.sink_tokens = sink_tokens
        self.far_term = bool(far_term)
        self.log_mix = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32)) if far_term and learn_mix else None
        # log λ per feature-map head (the heads of the linear state): a parameter, a fixed buffer, or None
        if far_decay is None:
            if learn_decay:
                raise ValueError("learn_decay needs far_decay (the initial decay length in tokens)")
            self.register_buffer("far_log_decay", None)
        else:
            if isinstance(far_decay, bool) or not isinstance(far_decay, (int, float)) or not far_decay > 0:
                raise ValueError(f"far_decay must be a positive number of tokens (or None), got {far_decay!r}")
            init = torch.full((self.feature_map.num_heads,), -math.log(float(far_decay)), dtype=torch.float32)
            if learn_decay:
                self.far_log_decay = nn.Parameter(init)
            else:
                self.register_buffer("far_log_decay", init)

    def decay_rates(self, per_query_head: bool = False) -> Tensor | None:
        """λ of the far terms, nats per token past the window, or ``None`` without a decay.

        Args:
            per_query_head: repeat the rates of maps shared by a KV group for each query head of the group.

        Returns:
            ``(H,)`` float32: H = the feature map's heads, or Hq with ``per_query_head``.
        """
        if self.far_log_decay is None:
            return None
        rates = self.far_log_decay.float().exp()
        if per_query_head and self.shares_kv_maps:
            rates = rates.repeat_interleave(self.num_heads // self.num_kv_heads)
        return rates

    def extra_repr(self) -> str:
        """The linear layer's fields plus the sliding window, sink tokens and far term, for ``print(module)``."""
        far = "linear" if self.far_term else "none"
        decay = "" if self.far_log_decay is None else f", far_decay={(-self.far_log_decay).exp().tolist()}"
        return f"{super().extra_repr()}, window={self.window}, sink_tokens={self.sink_tokens}, far_term={far}{decay}"

    def exact_log_features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Log-features with every constant kept (the far terms are added to exact softmax terms).

        Args:
            q: ``(B, Hq, T, d)`` queries.
            k: ``(B, Hk, Tk, d)`` keys.

        Returns:
            ``log φ(q)`` ``(B, Hq, T, M)`` and ``log φ(k)`` ``(B, Hk, Tk, M)`` (maps shared per KV head) or
            ``(B, Hq, Tk, M)`` (per-query-head maps).
        """
        B, Hq, T, d = q.shape
        group = self.num_heads // self.num_kv_heads
        fm = self.feature_map
        if self.shares_kv_maps:
            return fm.log_features(q.reshape(B, self.num_kv_heads, group * T, d)).view(B, Hq, T, -1), fm.log_features(k)
        return fm.log_features(q), fm.log_features(k.repeat_interleave(group, dim=1))

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: SlidingWindowState | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> tuple[Tensor, SlidingWindowState]:
        """Attend causally, continuing from ``state`` if given.

        Args:
            q: ``(B, Hq, T, d)`` queries, scaled so that the softmax logits are qᵀk/√d.
            k: ``(B, Hk, Tk, d)`` keys, Tk ≥ T (the first Tk − T are a prefix without queries, e.g. a softmax
                KV cache handed over).
            v: ``(B, Hk, Tk, D)`` values.
            state: :class:`~lit_dof.attention.sliding_window.SlidingWindowState` of the preceding tokens.
            key_padding_mask: ``(B, Tk)`` bool, False for padding keys.

        Returns:
            ``(y (B, Hq, T, D) in v's dtype, state)``.

        Raises:
            ValueError: shapes inconsistent with the layer, or Tk < T.
        """
        B, Hq, T, d = q.shape
        Tk = self.check_call(q, k, v, key_padding_mask)
        if Tk > T:  # a prefix without queries: fold it in with placeholder queries whose outputs are dropped
            prefix = q.new_zeros(B, Hq, Tk - T, d)
            pad = None if key_padding_mask is None else key_padding_mask[:, : Tk - T]
            _, state = self(prefix, k[:, :, : Tk - T], v[:, :, : Tk - T], state, pad)
            k, v = k[:, :, Tk - T :], v[:, :, Tk - T :]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[:, Tk - T :]
        log_q = log_k = None
        if self.far_term:
            log_q, log_k = self.exact_log_features(q, k)
        if not self.shares_kv_maps:  # per-query-head maps: the state is per query head
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return sliding_window_linear_attention(
            q, k, v, log_q, log_k, window=self.window, sink_tokens=self.sink_tokens, log_mix=self.log_mix,
            far_decay=self.decay_rates(), state=state, key_padding_mask=key_padding_mask, chunk_size=self.chunk_size,
        )  # fmt: skip  # packed args
