"""Per-head feature dimensions: one layer's KV heads grouped by their feature dimension M.

A DoF allocation per head (``dof_head``) gives each KV head h of a layer its own M_h. Padding every head to
the layer's largest M would spend compute and recurrent-state bytes on zero features, so the heads with
equal M form a group, each group is an ordinary linear-attention layer (pure or sliding-window) over its
KV heads and their query heads, and the groups run one after another: compute and state bytes follow
Σ_h M_h, at the price of one kernel call per distinct M (allocate with ``multiple_of`` to keep that number
small).

A KV head with M = 0 is exact: the group of such heads is an
:class:`~lit_dof.attention.layers.exact.ExactAttention` (full causal softmax, its state a growing KV cache), so
``[0, 32, 32]`` keeps a layer's first KV head exact and linearises the other two (DuoAttention's split of
retrieval heads and streaming heads, arXiv 2410.10819).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from lit_dof.attention.layers.exact import ExactAttention
from lit_dof.attention.layers.linear import CausalLinearAttention
from lit_dof.attention.ops.rotary import Rotary
from lit_dof.precision import Float32Parameters


@dataclass
class GroupedState:
    """The decoding states of a :class:`HeadGroupedAttention`, one per head group (in group order)."""

    states: list

    @property
    def nbytes(self) -> int:
        """Bytes held by all groups' states."""
        return sum(s.nbytes for s in self.states)

    def index_select(self, dim: int, index: Tensor) -> "GroupedState":
        """Select batch rows (``dim=0``) in every group's state."""
        return GroupedState([s.index_select(dim, index) for s in self.states])

    def repeat_interleave(self, repeats: int) -> "GroupedState":
        """Repeat every batch row ``repeats`` times in every group's state."""
        return GroupedState([s.repeat_interleave(repeats) for s in self.states])


def head_groups(head_dims: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``[(M, [KV heads with that M]), …]`` in increasing M (M = 0, the exact heads, first); heads keep their order
    within a group.

    Raises:
        ValueError: an M that is not an integer ≥ 0.
    """
    groups: dict[int, list[int]] = {}
    for head, m in enumerate(head_dims):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"feature dim of KV head {head} must be an integer >= 0 (0: exact), got {m!r}")
        groups.setdefault(m, []).append(head)
    return sorted(groups.items())


class HeadGroupedAttention(Float32Parameters):
    """Linear (or sliding-window + linear) attention whose KV heads have their own feature dimensions.

    Args:
        build: ``(num_heads, num_kv_heads, feature_dim) -> CausalLinearAttention`` — builds one group's layer
            (its feature map has ``num_kv_heads`` heads, shared by their query heads).
        head_dims: M_h per KV head, length Hk; 0 keeps the head exact (:class:`ExactAttention`, no ``build``).
        num_heads: Hq (a multiple of Hk).

    Raises:
        ValueError: bad dims, or ``num_heads`` not a multiple of ``len(head_dims)``.
    """

    def __init__(
        self, build: Callable[[int, int, int], CausalLinearAttention], head_dims: Sequence[int], num_heads: int
    ) -> None:
        super().__init__()
        self.num_kv_heads = len(head_dims)
        if self.num_kv_heads < 1 or num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of the number of KV heads ({self.num_kv_heads})"
            )
        self.num_heads = num_heads
        self.head_dims = [int(m) for m in head_dims]
        group = num_heads // self.num_kv_heads
        self.groups = nn.ModuleList()
        self._kv_index, self._q_index = [], []
        for m, heads in head_groups(self.head_dims):
            layer = (
                ExactAttention(len(heads) * group, len(heads)) if m == 0 else build(len(heads) * group, len(heads), m)
            )
            self.groups.append(layer)
            self._kv_index.append(heads)
            self._q_index.append([h * group + g for h in heads for g in range(group)])

    def extra_repr(self) -> str:
        """Query heads, KV heads (GQA) and each KV head's feature dimension M, for ``print(module)``."""
        return f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dims={self.head_dims}"

    @property
    def exact_heads(self) -> list[int]:
        """The KV heads kept exact (M = 0), in increasing order."""
        return [h for h, m in enumerate(self.head_dims) if m == 0]

    @property
    def twins(self) -> list[CausalLinearAttention]:
        """The linear groups (every group but the exact one), in group order."""
        return [layer for layer in self.groups if not isinstance(layer, ExactAttention)]

    @property
    def far_term(self) -> bool:
        """False when nothing is left to distil: every head exact, or the linear groups are sliding windows without
        a far term."""
        return bool(self.twins) and all(getattr(layer, "far_term", True) for layer in self.twins)

    @property
    def needs_rotary(self) -> bool:
        """Whether a group needs the call's rotary cos/sin (a far term on un-rotated q/k)."""
        return any(layer.needs_rotary for layer in self.groups)

    @property
    def far_gated(self) -> bool:
        """Whether a group's far memory has a forget gate that reads the values."""
        return any(layer.far_gated for layer in self.groups)

    @property
    def feature_dim_total(self) -> int:
        """Σ_h M_h over the KV heads (0 for an exact head): the features (and, × (D + 2), the linear state floats
        per batch row) of the layer."""
        return sum(self.head_dims)

    def split(self, q: Tensor, k: Tensor, *rest: Tensor):
        """Per group: ``(layer, q_g (B, Hq_g, T, d), k_g (B, Hk_g, Tk, d), *rest_g, query_heads)`` where every
        tensor in ``rest`` is indexed like ``k`` (KV heads on dim 1)."""
        for layer, kv, qh in zip(self.groups, self._kv_index, self._q_index):
            kv_t = torch.tensor(kv, device=k.device)
            q_t = torch.tensor(qh, device=q.device)
            yield layer, q.index_select(1, q_t), k.index_select(1, kv_t), *(x.index_select(1, kv_t) for x in rest), q_t

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: GroupedState | None = None,
        key_padding_mask: Tensor | None = None,
        *,
        rotary: Rotary | None = None,
    ) -> tuple[Tensor, GroupedState]:
        """Attend causally, group by group.

        Args:
            q: ``(B, Hq, T, d)`` queries.
            k: ``(B, Hk, Tk, d)`` keys.
            v: ``(B, Hk, Tk, D)`` values.
            state: from a previous call, or ``None``.
            key_padding_mask: ``(B, Tk)`` bool.
            rotary: ``(cos, sin)`` of the T positions, handed to every group.

        Returns:
            ``(y (B, Hq, T, D) in v's dtype, GroupedState)``.

        Raises:
            ValueError: head counts that do not match the layer.
        """
        if q.shape[1] != self.num_heads or k.shape[1] != self.num_kv_heads or v.shape[1] != self.num_kv_heads:
            raise ValueError(
                f"expected q with {self.num_heads} heads and k, v with {self.num_kv_heads}, got q "
                f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        B, _, T, _ = q.shape
        y = v.new_empty(B, self.num_heads, T, v.shape[-1])
        states = []
        for i, (layer, qg, kg, vg, query_heads) in enumerate(self.split(q, k, v)):
            yg, sg = layer(qg, kg, vg, None if state is None else state.states[i], key_padding_mask, rotary=rotary)
            y = y.index_copy(1, query_heads, yg.to(y.dtype))
            states.append(sg)
        return y, GroupedState(states)
