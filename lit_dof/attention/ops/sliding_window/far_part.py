"""The far part of sliding-window + linear attention: linear attention of the new queries over the key stream delayed
by the window (:mod:`lit_dof.attention.ops.sliding_window.chunked`), queries and far keys aligned one to one, so that
forget gates and decays are offsets of the log-features (:mod:`lit_dof.attention.ops.linear.aligned`); with write
strengths, the far values come from a delta-rule memory (:mod:`lit_dof.attention.ops.delta_rule.far`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from lit_dof.attention.ops.delta_rule.far import delta_far_attention
from lit_dof.attention.ops.linear.aligned import aligned_linear_attention
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE


@dataclass(frozen=True)
class FarPart:
    """Linear attention of T queries over the stream delayed by w tokens (keys of position < s excluded).

    The stream holds b buffered then T new tokens; stream index j is position P − b + j. Query i sees stream
    keys j0 ≤ j ≤ b + i − w (j0: the first non-sink) plus the carried state: queries and far keys are aligned one
    to one (query i with the key w positions earlier), so the gates Σ_{t+w<i'≤P+i} g_i' of a far key at position t
    are those of the aligned indices after the key's (``gates`` ``(B, Hk, T)``, one per query). With ``write``
    (``(B, Hk, b + T)``, per stream key) the values are read from the delta-rule memory
    (:func:`~lit_dof.attention.ops.delta_rule.far.delta_far_attention`).
    """

    b: int
    P: int
    window: int
    sinks: int
    chunk_size: int
    kernel: str

    def __call__(self, log_phi_q, log_phi, values, linear, gates, write, memory):
        """``(y (B, Hq, T, D), log_z (B, Hq, T), state, memory)``, or ``(None, None, linear, memory)`` when no
        query has a far key."""
        T = log_phi_q.shape[2]
        j0 = max(0, self.sinks - (self.P - self.b))  # the first stream key that is not a sink
        first = j0 + self.window - self.b  # the first query with a stream key in its far part (≥ 0: b ≤ w)
        count = max(0, T - first)  # queries (and stream keys) aligned one to one
        if linear is None and count == 0:
            return None, None, None, memory
        lk, lv = log_phi[:, :, j0 : j0 + count], values[:, :, j0 : j0 + count]
        beta = None if write is None else write[:, :, j0 : j0 + count]
        if linear is None:  # the first `first` queries have no far key at all: run the others alone
            g = None if gates is None else gates[:, :, first:]
            y, log_z, state, memory = self._run(log_phi_q[:, :, first:], lk, lv, None, g, beta, None)
            y = F.pad(y, (0, 0, T - count, 0))
            log_z = F.pad(log_z, (T - count, 0), value=float("-inf"))
            return y, log_z, state, memory
        skip = T - count  # queries that see only the carried state: empty keys (φ = 0, β = 0) in front
        lk = F.pad(lk, (0, 0, skip, 0), value=EMPTY_LOG_SCALE)
        lv = F.pad(lv, (0, 0, skip, 0))
        beta = None if beta is None else F.pad(beta, (skip, 0))
        return self._run(log_phi_q, lk, lv, linear, gates, beta, memory)

    def _run(self, lq, lk, lv, linear, gates, beta, memory):
        if beta is None:
            y, log_z, state = aligned_linear_attention(
                lq, lk, lv, linear, chunk_size=self.chunk_size, log_gates=gates, kernel=self.kernel
            )
            return y, log_z, state, None
        return delta_far_attention(
            lq, lk, lv, linear, memory, beta, chunk_size=self.chunk_size, log_gates=gates, kernel=self.kernel
        )
