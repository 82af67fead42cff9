"""``SlidingWindow``: the options of sliding-window + linear attention, as one value.

The same settings travel from a YAML file (``model.init_args.sliding_window``) through the student module,
:func:`~lit_dof.students.modeling.linearize`, the surgery and a saved student's ``config.json`` down to
:class:`~lit_dof.attention.SlidingWindowLinearAttention`; they are validated once, here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class SlidingWindow:
    """Sliding-window + linear attention: exact softmax over the last ``window`` tokens and the first
    ``sink_tokens``, a feature map's linear attention over everything older (the far term), all in one
    normaliser (:mod:`lit_dof.attention.ops.sliding_window.chunked`; LoLCATs, Zhang et al. 2024, §3.2; StreamingLLM,
    Xiao et al. 2024, for the sinks).

    Args:
        window: w, tokens attended exactly, the query's own included; ``0``: pure linear attention (every
            other option must then keep its default).
        sink_tokens: s ≥ 0, first tokens of the sequence always attended exactly (attention sinks).
        far_term: include the linear far term; ``False`` leaves the window and sinks alone (a control with
            nothing to train).
        learn_mix: give each query head a trainable log-weight β of its far term (initialised to 0: the far
            terms count as the kernel estimates they are).
        far_decay: τ > 0 in tokens: weight the far terms by e^{−(distance past the window)/τ} (RetNet's decay
            on the far part only), so the far term reaches about τ tokens past the window at any context
            length; ``None``: no decay.
        learn_decay: train the decay rates (log λ per feature-map head, initialised to ``log(1/far_decay)``; per
            feature with ``far_decay_spread``).
        far_decay_spread: r ≥ 1: one decay per feature of the far term instead of one per head (GLA's per-channel
            decay, Yang et al. 2024, §4, without its data dependence), so one head keeps fast and slow features at
            the same state; the initial τ of a head's M features log-spaced from ``far_decay`` to r·``far_decay``
            (r = 1: all at ``far_decay``, which must be ≥ ``gate_min_decay``). A rate is capped at
            1/``gate_min_decay`` (the kernel's segments stay long). ``None``: one decay per head. With the additive
            far term alone (no gate, no far cache).
        far_gate: a data-dependent forget gate of the far memory instead of a fixed decay: each token, as it arrives,
            keeps ``e^{g}`` of every far key's weight, ``g = −σ(w_hᵀv/√D + b_h)/gate_min_decay`` from its own value
            vector v per feature-map head (the scalar gate of Mamba-2, Dao & Gu 2024, §3, and simple GLA, Yang et
            al. 2024), so the memory can hold on to what matters and drop what does not; initialised (w = 0) at
            the fixed decay of ``far_decay``, which it needs.
        gate_min_decay: τ_min > 0 in tokens, the fastest the gate may forget (rate ≤ 1/τ_min nats per token):
            below ``far_decay``; bounded so the kernel's segments stay long
            (:mod:`lit_dof.attention.ops.linear.aligned`).
        far_memory: ``"additive"``: the far term averages the far values under their kernel weights (linear
            attention); ``"delta"``: the far values are read from a delta-rule memory over the same features,
            which overwrites what a key held (writes β = σ(uᵀv/√D + a) per feature-map head from the key's own
            value; DeltaNet, Schlag et al. 2021; :mod:`lit_dof.attention.ops.delta_rule.far`), weighted by the
            same kernel estimate of the far mass. No attention rows: train it with the output loss.
        far_cache: K ≥ 0 far tokens per feature-map head kept exactly beside the window and sinks — the K of
            highest attention mass from the window while they were in it (:mod:`lit_dof.attention.ops.sliding_window.
            far_cache`); the far term covers the rest. With the additive far term (no ``far_gate``, no
            ``"delta"``; no attention rows of the windowed softmax loss: train it with the output loss) or without
            a far term (``far_term: false``: window + sinks + the K heavy hitters, nothing to train).
        far_cache_score: what ranks the far tokens the cache keeps: ``"window_mass"``, the attention mass the window
            gave them (H2O), or ``"novelty"``, ``1 − max cos`` of a key with the keys before it in its window
            (:func:`lit_dof.attention.ops.sliding_window.far_cache.key_novelty`).
        far_cache_pool: r ≥ 0, with the novelty score: a token ranks by the highest novelty of itself and the r
            tokens after it, so the run before a novel token is kept with it (r < window).
        far_rope: ``True``: the far term's feature maps see post-RoPE queries and keys, like the exact parts;
            ``False``: they see them with the rotary embedding undone (``lit_dof.attention.ops.rotary.unrotate``),
            so the far term depends on content alone, never on absolute positions (the window keeps RoPE).
            Needs a teacher with rotary positions; without a far term it changes nothing.

    Raises:
        ValueError: a negative or non-integer ``window``/``sink_tokens``, ``far_decay <= 0``, ``learn_decay``
            without ``far_decay``, ``far_gate`` without ``far_decay``, with ``learn_decay`` or with
            ``gate_min_decay >= far_decay``, ``far_decay_spread`` below 1, without ``far_decay``, with ``far_decay``
            below ``gate_min_decay`` or with a gate, a far cache or the delta rule, an unknown ``far_memory`` or
            ``"delta"`` without a far term, a negative ``far_cache`` or one with a gated or delta-rule far term, or
            a window option set while ``window = 0``.
    """

    window: int = 0
    sink_tokens: int = 0
    far_term: bool = True
    learn_mix: bool = True
    far_decay: float | None = None
    learn_decay: bool = False
    far_decay_spread: float | None = None
    far_gate: bool = False
    gate_min_decay: float = 16.0
    far_memory: str = "additive"
    far_cache: int = 0
    far_cache_score: str = "window_mass"
    far_cache_pool: int = 0
    far_rope: bool = True

    def __post_init__(self) -> None:
        for name in ("window", "sink_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"sliding_window.{name} must be an integer >= 0, got {value!r}")
        decay = self.far_decay
        if decay is not None and (isinstance(decay, bool) or not isinstance(decay, (int, float)) or not decay > 0):
            raise ValueError(f"sliding_window.far_decay must be a positive number of tokens (or None), got {decay!r}")
        if self.learn_decay and decay is None:
            raise ValueError("sliding_window.learn_decay needs far_decay (the initial decay length in tokens)")
        self._check_gate()
        self._check_spread()
        if self.far_memory not in ("additive", "delta"):
            raise ValueError(f"sliding_window.far_memory must be 'additive' or 'delta', got {self.far_memory!r}")
        if self.far_memory == "delta" and not self.far_term:
            raise ValueError("sliding_window.far_memory 'delta' needs the far term (far_term: true)")
        self._check_cache()
        if self.far_cache and self.far_term and (self.far_gate or self.far_memory != "additive"):
            raise ValueError(
                "sliding_window.far_cache needs the additive far term without a gate (far_gate: false, far_memory: "
                "additive) or no far term (far_term: false): only there is a cached key's far share exactly removable"
            )
        changed = [f.name for f in fields(self) if f.name != "window" and getattr(self, f.name) != f.default]
        if self.window == 0 and changed:
            raise ValueError(
                f"sliding_window options {changed} need a sliding window: set sliding_window.window >= 1 "
                "(window 0 is pure linear attention), or leave them at their defaults (compose a pure linear "
                "method over configs/base.yaml, not over a windowed recipe such as configs/quickstart.yaml)"
            )

    def _check_cache(self) -> None:
        cache, score, pool = self.far_cache, self.far_cache_score, self.far_cache_pool
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 0:
            raise ValueError(f"sliding_window.far_cache must be an integer >= 0, got {cache!r}")
        if score not in ("window_mass", "novelty"):
            raise ValueError(f"sliding_window.far_cache_score must be 'window_mass' or 'novelty', got {score!r}")
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0 or (pool and score != "novelty"):
            raise ValueError(f"sliding_window.far_cache_pool must be an integer >= 0, novelty score only: {pool!r}")
        if pool and pool >= self.window:
            raise ValueError(f"sliding_window.far_cache_pool {pool} must be below the window ({self.window} tokens)")

    def _check_spread(self) -> None:
        spread = self.far_decay_spread
        if spread is None:
            return
        if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not spread >= 1:
            raise ValueError(f"sliding_window.far_decay_spread must be a number >= 1 (or None), got {spread!r}")
        if self.far_decay is None:
            raise ValueError("sliding_window.far_decay_spread needs far_decay (the fastest initial decay, in tokens)")
        if self.far_decay < self.gate_min_decay:
            raise ValueError(
                f"sliding_window.far_decay ({self.far_decay}) must be at least gate_min_decay ({self.gate_min_decay}), "
                "the fastest a feature of a decay per feature may forget: raise far_decay or lower gate_min_decay"
            )
        if self.far_gate or self.far_cache or self.far_memory != "additive":
            raise ValueError(
                "sliding_window.far_decay_spread (a decay per feature) goes with the additive far term alone: set "
                "far_gate: false, far_cache: 0 and far_memory: additive"
            )

    def _check_gate(self) -> None:
        floor = self.gate_min_decay
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not floor > 0:
            raise ValueError(f"sliding_window.gate_min_decay must be a positive number of tokens, got {floor!r}")
        if not self.far_gate:
            return
        if self.far_decay is None:
            raise ValueError("sliding_window.far_gate needs far_decay (the decay length in tokens the gate starts at)")
        if self.learn_decay:
            raise ValueError("sliding_window.far_gate learns its own decay: set learn_decay: false")
        if not self.far_decay > floor:
            raise ValueError(
                f"sliding_window.far_decay ({self.far_decay}) must exceed gate_min_decay ({floor}), the fastest the "
                "gate may forget: raise far_decay or lower gate_min_decay"
            )

    @property
    def far_unrotated(self) -> bool:
        """Whether there is a far term whose feature maps see un-rotated q/k (``far_term`` and not ``far_rope``)."""
        return self.far_term and not self.far_rope

    @property
    def enabled(self) -> bool:
        """Whether there is a window at all (``window >= 1``); ``False`` means pure linear attention."""
        return self.window > 0

    def activation_bytes(self, batch: int, query_heads: int, tokens: int, chunk_size: int) -> int:
        """Bytes the exact part of one sliding-window layer keeps for backward when its q/k/v need gradients:
        the float32 logits and softmax weights of the band (T queries × C + w − 1 keys per head, chunked) and of
        the sinks.

        Args:
            batch: B, sequences.
            query_heads: Hq.
            tokens: T, tokens per sequence.
            chunk_size: C, the query chunk of the kernel.

        Returns:
            ``2 · 4 · B · Hq · T · (min(C, T) + w − 1 + s)`` bytes; 0 without a window.
        """
        if not self.enabled:
            return 0
        band = min(chunk_size, tokens) + self.window - 1 + self.sink_tokens
        return 2 * 4 * batch * query_heads * tokens * band

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-ready dict (what a student's ``config.json`` stores)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> SlidingWindow:
        """The options from :meth:`to_dict`'s dict, or from any mapping holding some of the field names (other
        keys are ignored, so the flat keys of an older ``config.json`` read too); ``None``: no window.

        Raises:
            ValueError: invalid options (see the class).
        """
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in (values or {}).items() if key in names})
