"""The recurrent state of causal linear attention (constant in the sequence length T)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Log-scale of an empty state: finite (so that ``NEG - NEG`` is 0, not NaN) and far below any real log-feature.
EMPTY_LOG_SCALE = -1.0e30


@dataclass
class LinearAttentionState:
    """Prefix summary of keys and values for causal linear attention, stored in fp32.

    With log-features ``ℓ_j = log φ(k_j)`` (METHOD.md §1), the state after t tokens is, per head and
    feature f::

        log_scale[f] = m_f = max_{j≤t} ℓ_{j,f}
        kv[f, :]     = Σ_{j≤t} exp(ℓ_{j,f} − m_f) v_j        # A_t of METHOD.md §1, rescaled
        k_sum[f]     = Σ_{j≤t} exp(ℓ_{j,f} − m_f)            # B_t of METHOD.md §1, rescaled

    The per-feature scale ``exp(m_f)`` is kept out of ``kv``/``k_sum`` so that neither overflows; it is
    re-applied on the query side, where a per-query constant cancels between numerator and denominator.
    ``k_sum`` ≥ 1 in every feature that has seen a key.

    Attributes:
        kv: ``(B, H, M, D)`` float32.
        k_sum: ``(B, H, M)`` float32 — the normaliser.
        log_scale: ``(B, H, M)`` float32 — the per-feature stabiliser m.
    """

    kv: Tensor
    k_sum: Tensor
    log_scale: Tensor

    @classmethod
    def empty(cls, batch: int, heads: int, feature_dim: int, value_dim: int, device=None) -> "LinearAttentionState":
        """An all-zero state (no tokens seen) with shapes ``(B, H, M, D)``, ``(B, H, M)``, ``(B, H, M)``."""
        return cls(
            kv=torch.zeros(batch, heads, feature_dim, value_dim, dtype=torch.float32, device=device),
            k_sum=torch.zeros(batch, heads, feature_dim, dtype=torch.float32, device=device),
            log_scale=torch.full((batch, heads, feature_dim), EMPTY_LOG_SCALE, dtype=torch.float32, device=device),
        )

    @property
    def nbytes(self) -> int:
        """Memory held by the state, in bytes (independent of the number of tokens seen)."""
        return sum(t.numel() * t.element_size() for t in (self.kv, self.k_sum, self.log_scale))

    def index_select(self, dim: int, index: Tensor) -> "LinearAttentionState":
        """Select batch rows (``dim=0``), e.g. for beam-search reordering."""
        return LinearAttentionState(
            self.kv.index_select(dim, index),
            self.k_sum.index_select(dim, index),
            self.log_scale.index_select(dim, index),
        )

    def repeat_interleave(self, repeats: int) -> "LinearAttentionState":
        """Repeat every batch row ``repeats`` times (e.g. ``num_return_sequences`` in generation)."""
        return LinearAttentionState(
            *(t.repeat_interleave(repeats, dim=0) for t in (self.kv, self.k_sum, self.log_scale))
        )
