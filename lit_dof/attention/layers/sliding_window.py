"""Sliding-window + linear attention as a layer: exact softmax over the last ``window`` tokens (and the
first ``sink_tokens``), a feature map φ's linear attention over everything older (the kernel and its
equations: :mod:`lit_dof.attention.ops.sliding_window.chunked`).

It is a :class:`~lit_dof.attention.CausalLinearAttention` (same feature map, GQA policy and call
signature), so students, hybrids, the caches and the distillation losses take it wherever they take the
pure linear layer; ``window = 0`` in the student configuration means that pure layer.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_dof.attention.feature_maps.base import FeatureMap
from lit_dof.attention.layers.linear import CausalLinearAttention
from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE
from lit_dof.attention.ops.rotary import Rotary, rotary_from_angles, rotation_angles, unrotate
from lit_dof.attention.ops.sliding_window.chunked import SlidingWindowState, sliding_window_linear_attention


def _option(name: str, doc: str) -> property:
    """A read-only property of the layer that reads ``self.sliding_window.<name>`` (one source for each option)."""
    return property(lambda self: getattr(self.sliding_window, name), doc=f"{doc} (``sliding_window.{name}``)")


def _read_values(v: Tensor, weight: Tensor, bias: Tensor, what: str) -> Tensor:
    """``w_hᵀ v_t / √D + b_h`` per head and token, ``(B, H, T)`` float32, from ``v`` ``(B, H, T, D)``, ``weight``
    ``(H, D)``, ``bias`` ``(H,)``; ``ValueError`` naming ``what`` for values of another layout."""
    heads, size = weight.shape
    if v.shape[1] != heads or v.shape[-1] != size:
        raise ValueError(f"{what} reads values (B, {heads}, T, {size}), got {tuple(v.shape)}")
    return torch.einsum("bhtd,hd->bht", v.float(), weight) / math.sqrt(size) + bias[None, :, None]


class SlidingWindowLinearAttention(CausalLinearAttention):
    """Causal attention with an exact sliding window (plus attention sinks) and a linear far term.

    Args:
        feature_map: φ of the far term (``num_heads`` = Hk for maps shared per KV head, or Hq).
        num_heads: Hq. num_kv_heads: Hk (``None``: Hq).
        sliding_window: the window (w ≥ 1), sink tokens, far term, mixing weight, decay and gate
            (:class:`~lit_dof.attention.layers.window_options.SlidingWindow`).
        chunk_size: chunk size of both parts' parallel forms.
        window_kernel: ``"torch"`` or ``"flex"``, the exact part's kernel on a fresh sequence
            (:func:`~lit_dof.attention.ops.sliding_window.chunked.sliding_window_linear_attention`); an
            attribute, so it can be switched on a built student.
        linear_kernel: ``"torch"`` or ``"fla"`` (flash-linear-attention), the far term's kernel; an attribute too.

    Raises:
        ValueError: ``sliding_window.window < 1``, or a feature map / head layout the parent rejects.
    """

    def __init__(
        self,
        feature_map: FeatureMap,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        sliding_window: SlidingWindow,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        decode_max_tokens: int = 1,
        window_kernel: str = "torch",
        linear_kernel: str = "torch",
    ) -> None:
        super().__init__(
            feature_map, num_heads, num_kv_heads, chunk_size=chunk_size, decode_max_tokens=decode_max_tokens
        )
        self.window_kernel, self.linear_kernel = window_kernel, linear_kernel
        if linear_kernel == "fla" and sliding_window.far_decay_spread is not None:
            raise ValueError(
                "linear_kernel 'fla' takes one far-term gate per head (fla's chunk_simple_gla); a decay per feature "
                "(sliding_window.far_decay_spread) runs on linear_kernel 'torch'"
            )
        if not isinstance(sliding_window, SlidingWindow) or not sliding_window.enabled:
            raise ValueError(f"sliding_window must be a SlidingWindow with window >= 1, got {sliding_window!r}")
        self.sliding_window = sliding_window
        learned = sliding_window.far_term and sliding_window.learn_mix
        self.log_mix = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32)) if learned else None
        self.far_write_weight = self.far_write_bias = None
        if sliding_window.far_term and sliding_window.far_memory == "delta":  # β = σ(0) = 1/2 at the start
            heads, size = self.feature_map.num_heads, self.feature_map.head_dim
            self.far_write_weight = nn.Parameter(torch.zeros(heads, size, dtype=torch.float32))
            self.far_write_bias = nn.Parameter(torch.zeros(heads, dtype=torch.float32))
        # log λ per feature-map head (the heads of the linear state): a parameter, a fixed buffer, or None
        self.far_gate_weight = self.far_gate_bias = None
        if sliding_window.far_decay is None or not sliding_window.far_term:
            self.register_buffer("far_log_decay", None)
        elif sliding_window.far_gate:  # the gate σ(wᵀv/√D + b)/τ_min starts at the fixed rate 1/far_decay (w = 0)
            self.register_buffer("far_log_decay", None)
            heads, start = self.feature_map.num_heads, sliding_window.gate_min_decay / float(sliding_window.far_decay)
            self.far_gate_weight = nn.Parameter(torch.zeros(heads, self.feature_map.head_dim, dtype=torch.float32))
            self.far_gate_bias = nn.Parameter(torch.full((heads,), math.log(start / (1 - start)), dtype=torch.float32))
        else:
            init = _initial_log_rates(self.feature_map.num_heads, self.feature_map.feature_dim, sliding_window)
            if sliding_window.learn_decay:
                self.far_log_decay = nn.Parameter(init)
            else:
                self.register_buffer("far_log_decay", init)

    window = _option("window", "w, tokens attended exactly.")
    sink_tokens = _option("sink_tokens", "s, first tokens always attended exactly.")
    far_term = _option("far_term", "Whether the linear far term is included.")
    needs_rotary = _option(
        "far_unrotated", "Whether :meth:`forward` needs the call's ``rotary`` (a far term on un-rotated q/k)."
    )

    def far_inputs(self, q: Tensor, k: Tensor, rotary: Rotary | None) -> tuple[Tensor, Tensor]:
        """The queries and keys the far term's feature maps see: ``q``, ``k`` themselves (post-RoPE), or with the
        rotary embedding undone when ``far_rope=False``.

        Args:
            q: ``(B, Hq, T, d)`` post-RoPE queries.
            k: ``(B, Hk, T, d)`` post-RoPE keys at the same T positions.
            rotary: ``(cos, sin)`` of those positions (:data:`~lit_dof.attention.ops.rotary.Rotary`).

        Raises:
            ValueError: ``far_rope=False`` and no ``rotary`` (e.g. a teacher without rotary positions).
        """
        if not self.needs_rotary:
            return q, k
        if rotary is None:
            raise ValueError(
                "this sliding-window layer's far term sees un-rotated q/k (sliding_window.far_rope=False) and needs "
                "the rotary cos/sin of the call's positions: call it through the model (the lit_dof attention function "
                "passes them), pass rotary=(cos, sin), or use far_rope=True for a teacher without rotary positions"
            )
        return unrotate(q, rotary), unrotate(k, rotary)

    def decay_rates(self, per_query_head: bool = False) -> Tensor | None:
        """λ of the far terms, nats per token past the window, or ``None`` without a decay.

        Args:
            per_query_head: repeat the rates of maps shared by a KV group for each query head of the group.

        Returns:
            ``(H,)`` float32 (``(H, M)``, one per feature, with ``far_decay_spread``, each at most
            1/``gate_min_decay``): H = the feature map's heads, or Hq with ``per_query_head``.
        """
        if self.far_log_decay is None:
            return None
        log_rates = self.far_log_decay.float()
        if log_rates.dim() == 2:
            log_rates = log_rates.clamp_max(-math.log(self.sliding_window.gate_min_decay))
        rates = log_rates.exp()
        if per_query_head and self.shares_kv_maps:
            rates = rates.repeat_interleave(self.num_heads // self.num_kv_heads, dim=0)
        return rates

    @property
    def far_delta(self) -> bool:
        """Whether the far values come from a delta-rule memory (``sliding_window.far_memory == "delta"``)."""
        return self.far_write_weight is not None

    def far_write_strengths(self, v: Tensor) -> Tensor | None:
        """The delta-rule memory's write strength of each token's key, ``β = σ(u_hᵀv/√D + a_h)``, or ``None`` for
        the additive far term.

        Args:
            v: ``(B, H, T, D)`` values, laid out as for :meth:`far_log_gates`.

        Returns:
            ``(B, H, T)`` float32 in (0, 1).

        Raises:
            ValueError: ``v`` with another head count or size than the layer's.
        """
        if self.far_write_weight is None:
            return None
        return torch.sigmoid(_read_values(v, self.far_write_weight, self.far_write_bias, "the delta-rule writes"))

    @property
    def far_gated(self) -> bool:
        """Whether the far memory has a data-dependent forget gate (``sliding_window.far_gate``): the layer's
        losses then need the values, which the gate reads."""
        return self.far_gate_weight is not None

    def far_log_gates(self, v: Tensor, per_query_head: bool = False) -> Tensor | None:
        """The log forget gate of the far memory at each token, ``g = −σ(w_hᵀv/√D + b_h)/τ_min`` (``far_gate``),
        or ``None`` without a gate (a fixed decay is :meth:`decay_rates`).

        Args:
            v: ``(B, H, T, D)`` values, H = the feature map's heads (the KV heads for maps shared per KV head,
                else the query heads, values repeated for them); ``D`` = the head size.
            per_query_head: repeat the gates of maps shared by a KV group for each query head of the group.

        Returns:
            ``(B, H, T)`` float32, in ``(−1/τ_min, 0)`` nats; ``(B, Hq, T)`` with ``per_query_head``.

        Raises:
            ValueError: ``v`` with another head count or size than the gate's.
        """
        if self.far_gate_weight is None:
            return None
        x = _read_values(v, self.far_gate_weight, self.far_gate_bias, "the far gate")
        gates = -torch.sigmoid(x) / self.sliding_window.gate_min_decay
        if per_query_head and self.shares_kv_maps:
            gates = gates.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        return gates

    def extra_repr(self) -> str:
        """The linear layer's fields plus the sliding window, sink tokens and far term, for ``print(module)``."""
        far = "linear" if self.far_term else "none"
        decay = ""
        if self.far_log_decay is not None and self.far_log_decay.dim() == 2:  # one τ per feature: their range
            tau = 1 / self.decay_rates()
            decay = f", far_decay=per feature, {tau.min().item():.4g}-{tau.max().item():.4g} tokens"
        elif self.far_log_decay is not None:
            decay = f", far_decay={(-self.far_log_decay).exp().tolist()}"
        decay += f", far_gate=True, gate_min_decay={self.sliding_window.gate_min_decay:g}" if self.far_gated else ""
        decay += ", far_memory='delta'" if self.far_delta else ""
        rope = "" if self.sliding_window.far_rope else ", far_rope=False"
        return (
            f"{super().extra_repr()}, window={self.window}, sink_tokens={self.sink_tokens}, far_term={far}{decay}{rope}"
        )

    def exact_log_features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`log_features` (same arguments and shapes) with every constant of φ kept, none dropped: the far
        terms are added to exact softmax terms, so they must be on the scale of exp(qᵀk/√d)."""
        fm = self.feature_map
        return self.grouped_log_features(q, k, lambda queries, keys: (fm.log_features(queries), fm.log_features(keys)))

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: SlidingWindowState | None = None,
        key_padding_mask: Tensor | None = None,
        *,
        rotary: Rotary | None = None,
    ) -> tuple[Tensor, SlidingWindowState]:
        """Attend causally, continuing from ``state`` if given.

        Args:
            q: ``(B, Hq, T, d)`` queries, scaled so that the softmax logits are qᵀk/√d.
            k: ``(B, Hk, Tk, d)`` keys, Tk ≥ T (the first Tk − T are a prefix without queries, e.g. a softmax
                KV cache handed over).
            v: ``(B, Hk, Tk, D)`` values.
            state: :class:`~lit_dof.attention.ops.sliding_window.chunked.SlidingWindowState` of the preceding tokens.
            key_padding_mask: ``(B, Tk)`` bool, False for padding keys.
            rotary: ``(cos, sin)`` ``(B or 1, T, r)`` of the T query positions; needed (only) when
                :attr:`needs_rotary`.

        Returns:
            ``(y (B, Hq, T, D) in v's dtype, state)``.

        Raises:
            ValueError: shapes inconsistent with the layer, Tk < T, or — when :attr:`needs_rotary` — no ``rotary``
                or a key prefix (Tk > T, whose positions ``rotary`` does not cover).
        """
        B, Hq, T, d = q.shape
        Tk = self.check_call(q, k, v, key_padding_mask)
        if Tk > T and self.needs_rotary:
            raise ValueError(
                f"far_rope=False: got {Tk - T} prefix keys without rotary positions (a softmax KV cache handed over); "
                "run the student with its own cache (student.new_cache()) or use far_rope=True"
            )
        if Tk > T:  # a prefix without queries: fold it in with placeholder queries whose outputs are dropped
            prefix = q.new_zeros(B, Hq, Tk - T, d)
            pad = None if key_padding_mask is None else key_padding_mask[:, : Tk - T]
            _, state = self(prefix, k[:, :, : Tk - T], v[:, :, : Tk - T], state, pad)
            k, v = k[:, :, Tk - T :], v[:, :, Tk - T :]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[:, Tk - T :]
        log_q = log_k = None
        if self.far_term:
            log_q, log_k = self.exact_log_features(*self.far_inputs(q, k, rotary))
        if not self.shares_kv_maps:  # per-query-head maps: the state is per query head
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        gates = self.far_log_gates(v) if self.far_term else None
        write = self.far_write_strengths(v) if self.far_term else None
        if self.far_term and state is not None and state.log_phi_k is None and state.keys.shape[2]:
            leaving = state.keys.shape[2] + T - self.window  # the held keys this call moves into the far memory
            state = dataclasses.replace(state, log_phi_k=self.window_log_features(state, leaving))
        y, new_state = sliding_window_linear_attention(
            q,
            k,
            v,
            log_q,
            log_k,
            window=self.window,
            sink_tokens=self.sink_tokens,
            log_mix=self.log_mix,
            far_decay=self.decay_rates(),
            far_log_gates=gates,
            far_write=write,
            state=state,
            key_padding_mask=key_padding_mask,
            chunk_size=self.chunk_size,
            window_kernel=self.window_kernel,
            linear_kernel=self.linear_kernel,
            far_cache=self.sliding_window.far_cache,
            far_cache_score=self.sliding_window.far_cache_score,
            far_cache_pool=self.sliding_window.far_cache_pool,
        )
        return y, self._lean(new_state, state, rotary, B)

    def window_log_features(self, state: SlidingWindowState, leaving: int | None = None) -> Tensor:
        """The far term's key log-features of the keys ``state`` holds in its window, recomputed from the keys
        (un-rotated with the angles the state kept when the far term sees un-rotated keys): what a key brings to
        the far memory when it leaves the window.

        Args:
            state: a state this layer returned (``keys`` ``(B, H, b, d)``; ``rotary`` when :attr:`needs_rotary`).
            leaving: compute only the oldest ``leaving`` keys' (those the next call moves into the far memory; the
                others are marked empty, as padding is); ``None``: all b.

        Returns:
            ``(B, H, b, M)``, H = the feature map's heads.

        Raises:
            ValueError: the layer needs the keys' rotation and ``state`` holds none.
        """
        held = state.keys.shape[2]
        n = held if leaving is None else max(0, min(held, leaving))
        keys = state.keys[:, :, :n]
        if self.needs_rotary:
            if state.rotary is None:
                raise ValueError("this state holds no rotation angles of its window keys: pass a state the layer made")
            keys = unrotate(keys, rotary_from_angles(state.rotary[:, :n]))
        features = self.feature_map.log_features(keys)
        return F.pad(features, (0, 0, 0, held - n), value=EMPTY_LOG_SCALE) if n < held else features

    def _lean(
        self, new: SlidingWindowState, prev: SlidingWindowState | None, rotary: Rotary | None, batch: int
    ) -> SlidingWindowState:
        """``new`` without the window keys' log-features (recomputed by :meth:`window_log_features` when the keys
        leave): with a far term on un-rotated keys it keeps their rotation angles instead, r/2 + 1 numbers per key
        where the log-features were H·M (docs/method_students.md, "Decode state"). A state from elsewhere with
        window keys but no angles keeps its log-features."""
        if not self.far_term:
            return new
        angles = None
        if self.needs_rotary:
            held = 0 if prev is None else prev.keys.shape[2]
            if held and prev.rotary is None:
                return new
            keep = new.keys.shape[2]
            fresh = min(keep, rotary[0].shape[1])  # the call's positions still in the window: only theirs are packed
            angles = rotation_angles((rotary[0][:, -fresh:], rotary[1][:, -fresh:])).expand(batch, -1, -1)
            if keep > fresh:  # and the held keys' that stay
                angles = torch.cat([prev.rotary[:, held - (keep - fresh) :], angles], 1)
            angles = angles.contiguous()
        return dataclasses.replace(new, log_phi_k=None, rotary=angles)


def _initial_log_rates(heads: int, features: int, options: SlidingWindow) -> Tensor:
    """log λ at the start: ``(heads,)`` at 1/``far_decay``, or ``(heads, features)`` with ``far_decay_spread`` r,
    τ log-spaced from ``far_decay`` to r·``far_decay`` over each head's features (the same for every head)."""
    fastest = math.log(float(options.far_decay))
    if options.far_decay_spread is None:
        return torch.full((heads,), -fastest, dtype=torch.float32)
    log_tau = torch.linspace(fastest, fastest + math.log(float(options.far_decay_spread)), features)
    return (-log_tau).to(torch.float32).expand(heads, features).clone()


def sliding_window_layers(module: nn.Module) -> list[SlidingWindowLinearAttention]:
    """Every :class:`SlidingWindowLinearAttention` inside ``module`` (itself included; the groups of per-head dims
    too), in module order."""
    return [m for m in module.modules() if isinstance(m, SlidingWindowLinearAttention)]
