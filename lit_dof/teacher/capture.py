"""Teacher capture: the post-RoPE queries and keys (optionally values and outputs) of a frozen teacher.

Capture rides on the ``"lit_dof"`` attention function (:mod:`lit_dof.interface`): while a capture is
active every attention layer calls a recorder with exactly the tensors softmax attention receives, and
then runs the teacher's own SDPA attention — the logits are those of the plain model.

For long runs memory is bounded by :class:`QKReservoir`: a uniform sample without replacement of J
vectors per head from everything seen (priority / bottom-k sampling: each vector gets a uniform random
priority and the J smallest are kept — the same distribution as reservoir sampling, vectorised). With a
``key`` per batch the priorities are a function of (seed, layer, key) alone, so reservoirs filled on
several processes merge exactly into the sample one process would draw from the union
(:meth:`QKReservoir.merge`, :meth:`QKReservoir.all_gather`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lit_dof.interface import ATTN_IMPLEMENTATION, AttentionSlot, attention_hook
from lit_dof.teacher.families import AttentionLayer, attention_layers

Pooling = Literal["kv_head", "query_head"]
LayerRecorder = Callable[[int, "CapturedAttention"], None]
"""``(layer index, its CapturedAttention)``: what :func:`capture_attention` reports for each layer (every field
filled in that the model has; a recorder keeps what it needs)."""


@contextlib.contextmanager
def capture_attention(model: nn.Module, recorder: LayerRecorder) -> Iterator[list[AttentionLayer]]:
    """Within the block, every attention layer of ``model`` reports its inputs to ``recorder``.

    Queries are reported as the model's kernel sees them: scaled so that the logits are qᵀk/√d
    (:func:`lit_dof.interface.effective_query`). The model's attention implementation and any attached
    linear twins are restored on exit; linear layers of a student report too (q/k are the same).

    Yields:
        the model's :class:`~lit_dof.teacher.families.AttentionLayer` list.
    """
    layers = attention_layers(model)
    previous = model.config._attn_implementation
    added, hooks = [], []
    for layer in layers:
        hooks.append(attention_hook(layer.module))
        slot = getattr(layer.module, "lit_dof", None)
        if not isinstance(slot, AttentionSlot):
            slot = AttentionSlot()
            layer.module.lit_dof = slot
            added.append(layer.module)
        slot.recorder = lambda module, q, k, v, pad, out, rotary: recorder(
            module.layer_idx, CapturedAttention(q=q, k=k, v=v, out=out, key_padding=pad, rotary=rotary)
        )
    if previous != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    try:
        yield layers
    finally:
        for layer in layers:
            layer.module.lit_dof.recorder = None
        for hook in hooks:
            if hook is not None:
                hook.remove()
        for module in added:
            del module.lit_dof
        if previous != ATTN_IMPLEMENTATION:
            model.set_attn_implementation(previous)


@dataclass
class CapturedAttention:
    """One layer's captured tensors for one batch (``None`` where not requested).

    Attributes:
        q: ``(B, Hq, T, d)`` post-RoPE queries, scaled to the qᵀk/√d convention.
        k: ``(B, Hk, T, d)`` post-RoPE keys. v: ``(B, Hk, T, D)`` values.
        out: ``(B, T, Hq, D)`` softmax attention output (before the output projection).
        key_padding: ``(B, T)`` bool, False at padding; ``None`` if nothing is padded.
        rotary: the layer's rotary ``(cos, sin)``, each ``(B or 1, T, r)``, that made q and k post-RoPE; ``None``
            for a model without rotary positions.
    """

    q: Tensor
    k: Tensor
    v: Tensor | None
    out: Tensor | None
    key_padding: Tensor | None
    rotary: tuple[Tensor, Tensor] | None = None


@torch.no_grad()
def capture_batch(
    model: nn.Module, batch: dict | Tensor, *, values: bool = False, outputs: bool = False
) -> tuple[Tensor, dict[int, CapturedAttention]]:
    """Run one batch through the teacher and return ``(logits (B, T, V), {layer: CapturedAttention})``.

    Args:
        model: a teacher of a supported family.
        batch: ``input_ids (B, T)`` or a dict with ``input_ids`` and optionally ``attention_mask``.
        values: also keep each layer's v.
        outputs: also keep each layer's attention output.
    """
    captured: dict[int, CapturedAttention] = {}

    def record(index: int, c: CapturedAttention) -> None:
        captured[index] = CapturedAttention(
            c.q.detach(),
            c.k.detach(),
            c.v.detach() if values else None,
            c.out.detach() if outputs else None,
            c.key_padding,
            c.rotary,
        )

    inputs = _as_inputs(batch)
    with capture_attention(model, record):
        logits = model(**inputs, use_cache=False).logits
    return logits, captured


def _as_inputs(batch: dict | Tensor) -> dict:
    if isinstance(batch, Tensor):
        return {"input_ids": batch}
    return {k: batch[k] for k in ("input_ids", "attention_mask") if k in batch and batch[k] is not None}


def pooled_vectors(
    q: Tensor, k: Tensor, key_padding: Tensor | None, pooling: Pooling, *, far_window: int = 0, sink_tokens: int = 0
) -> Tensor:
    """Per-head pools of query and key vectors of valid tokens.

    Args:
        q: ``(B, Hq, T, d)`` queries.
        k: ``(B, Hk, T, d)`` keys.
        key_padding: ``(B, T)`` bool, False at padding, or ``None``.
        pooling: ``"query_head"`` (the default of :func:`~lit_dof.dof.estimate_model_dof`) — one pool per
            query head with its KV head's keys: the paper's per-head rule, Hq heads per layer;
            ``"kv_head"`` — one pool per KV head with the queries of its whole GQA group (the kernel a
            map shared per KV head must fit). The layer DoF is the max over heads either way.
        far_window: w > 0 pools only the vectors of query–key pairs at least w tokens apart — the pairs the
            linear part of sliding-window + linear attention serves: queries at positions ≥ w + s, keys at
            positions s … T − 1 − w. 0: every token (the plain pooled DoF).
        sink_tokens: s, the first positions kept exact beside the window (excluded from the far pairs).

    Returns:
        ``(H, n, d)`` with H = Hk or Hq.
    """
    B, Hq, T, d = q.shape
    Hk = k.shape[1]
    G = Hq // Hk
    valid = torch.ones(B, T, dtype=torch.bool, device=q.device) if key_padding is None else key_padding.to(q.device)
    q_ok = k_ok = valid.reshape(-1)  # (B·T,)
    if far_window:
        position = torch.arange(T, device=q.device).expand(B, T)
        q_ok = q_ok & (position >= far_window + sink_tokens).reshape(-1)
        k_ok = k_ok & ((position >= sink_tokens) & (position <= T - 1 - far_window)).reshape(-1)
    keys = k.permute(1, 0, 2, 3).reshape(Hk, B * T, d)[:, k_ok]  # (Hk, n, d)
    if pooling == "kv_head":
        queries = q.view(B, Hk, G, T, d).permute(1, 2, 0, 3, 4).reshape(Hk, G, B * T, d)[:, :, q_ok]
        return torch.cat([queries.reshape(Hk, -1, d), keys], dim=1)
    if pooling == "query_head":
        queries = q.permute(1, 0, 2, 3).reshape(Hq, B * T, d)[:, q_ok]
        return torch.cat([queries, keys.repeat_interleave(G, dim=0)], dim=1)
    raise ValueError(f"pooling must be 'kv_head' or 'query_head', got {pooling!r}")


class QKReservoir:
    """A uniform sample of J vectors per (layer, head) from a stream, in bounded memory.

    Args:
        num_samples: J per head.
        seed: seed of the priorities (the sample is a deterministic function of the stream and the seed).

    Memory: ``L·H·J·d`` floats plus one batch of candidates.
    """

    def __init__(self, num_samples: int, *, seed: int = 0) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 2:
            raise ValueError(f"num_samples J must be an integer >= 2, got {num_samples!r}")
        self.num_samples, self.seed = num_samples, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.vectors: dict[int, Tensor] = {}
        self.priorities: dict[int, Tensor] = {}
        self.seen: dict[int, int] = {}

    def add(self, layer: int, vectors: Tensor, key: int | None = None) -> None:
        """Offer ``(H, n, d)`` vectors of one layer; keeps the J with the smallest random priorities.

        Args:
            layer: layer index.
            vectors: ``(H, n, d)``.
            key: the batch's identity (e.g. its global index, ≥ 0): its priorities are then drawn from a
                generator seeded by (seed, layer, key), the same in any process and order; ``None``: from this
                reservoir's own stream.
        """
        H, n, d = vectors.shape
        if n == 0:
            return
        vectors = vectors.detach().float().cpu()
        generator = self.generator
        if key is not None:
            state = np.random.SeedSequence([self.seed, layer, int(key)]).generate_state(2, dtype=np.uint32)
            generator = torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)
        self._keep(layer, vectors, torch.rand(H, n, generator=generator, device="cpu"), n)

    def _keep(self, layer: int, vectors: Tensor, prio: Tensor, seen: int) -> None:
        """Add candidates with their priorities and keep the J smallest."""
        d = vectors.shape[-1]
        if layer in self.vectors:
            vectors = torch.cat([self.vectors[layer], vectors], dim=1)
            prio = torch.cat([self.priorities[layer], prio], dim=1)
        keep = min(self.num_samples, vectors.shape[1])
        prio, idx = torch.topk(prio, keep, dim=1, largest=False, sorted=True)
        self.vectors[layer] = torch.gather(vectors, 1, idx.unsqueeze(-1).expand(-1, -1, d))
        self.priorities[layer] = prio
        self.seen[layer] = self.seen.get(layer, 0) + seen

    def merge(self, *others: "QKReservoir") -> "QKReservoir":
        """Fold other reservoirs (same J) into this one: the J smallest priorities of the union per head — with
        keyed batches, exactly the sample one reservoir fed every batch would hold.

        Raises:
            ValueError: a reservoir with another J.
        """
        for other in others:
            if other.num_samples != self.num_samples:
                raise ValueError(f"cannot merge reservoirs of J={other.num_samples} and J={self.num_samples}")
            for layer, vectors in other.vectors.items():
                self._keep(layer, vectors, other.priorities[layer], other.seen[layer])
        return self

    def all_gather(self, group=None) -> "QKReservoir":
        """Merge the reservoirs of every process of ``group`` (a collective): afterwards every rank holds the
        same sample, in the same order. No-op outside ``torch.distributed``."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self
        mine = {"vectors": self.vectors, "priorities": self.priorities, "seen": self.seen}
        gathered = [None] * torch.distributed.get_world_size(group)
        torch.distributed.all_gather_object(gathered, mine, group=group)
        self.vectors, self.priorities, self.seen = {}, {}, {}
        for part in gathered:  # rank order: identical on every rank
            other = QKReservoir(self.num_samples, seed=self.seed)
            other.vectors, other.priorities, other.seen = part["vectors"], part["priorities"], part["seen"]
            self.merge(other)
        return self

    def samples(self, layer: int) -> Tensor:
        """``(H, J, d)`` sample of a layer.

        Raises:
            ValueError: fewer than J vectors seen (feed more tokens or lower J).
        """
        have = self.vectors.get(layer)
        if have is None or have.shape[1] < self.num_samples:
            got = 0 if have is None else have.shape[1]
            raise ValueError(
                f"layer {layer}: only {got} query/key vectors per head were captured, fewer than num_samples="
                f"{self.num_samples}; feed more (or longer) batches or lower num_samples"
            )
        return self.vectors[layer]
