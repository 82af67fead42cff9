"""Generation cache for students: recurrent state for linear layers, a KV cache for softmax layers.

A linear layer's memory is its :class:`~lit_dof.attention.LinearAttentionState` — ``(B, Hk, M, D)`` plus two
``(B, Hk, M)`` vectors — whatever the context length; softmax layers of a hybrid keep transformers'
usual growing KV cache. :class:`RecurrentStateLayer` is a transformers ``CacheLayerMixin`` so that mask
sizes, positions and ``generate``'s batch/beam bookkeeping work unchanged.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache


class RecurrentStateLayer(CacheLayerMixin):
    """Cache layer of a linear-attention layer: keeps the recurrent state, never the keys and values.

    ``update`` passes the new keys/values straight through (the attention function turns them into the
    state) and counts tokens, so ``get_seq_length`` / ``get_mask_sizes`` agree with the softmax layers.

    Attributes:
        state: the layer's state after the tokens seen (set by :func:`lit_dof.interface.lit_dof_attention`),
            any object with ``index_select(dim, index)``, ``repeat_interleave(repeats)`` and ``nbytes``.
        seen: tokens folded into the state.
    """

    holds_linear_attention_state = True
    is_sliding = False
    is_compileable = False
    supports_early_init = False

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.state = None
        self.seen = 0

    @property
    def is_croppable(self) -> bool:
        """False: a recurrent state cannot be rolled back."""
        return False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Record the dtype and device of the first keys; the state itself is set by the attention function."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Count the new tokens and return them unchanged: ``(B, Hk, T, d)``, ``(B, Hk, T, D)``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.seen += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(tokens seen + query_length, 0)``: the key length and offset of the mask, as a full-attention layer's."""
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        """Tokens folded into the state."""
        return self.seen

    def get_max_length(self) -> int:
        """-1: no maximum length (the state has constant size)."""
        return -1

    @property
    def nbytes(self) -> int:
        """Bytes held by the state (0 before the first token)."""
        return 0 if self.state is None else self.state.nbytes

    def reset(self) -> None:
        """Drop the state and the token count."""
        self.state, self.seen = None, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the state's batch rows for beam search (``beam_idx (B,)``)."""
        if self.state is not None:
            self.state = self.state.index_select(0, beam_idx.to(self.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each batch row of the state ``repeats`` times (beam/sample expansion)."""
        if self.state is not None:
            self.state = self.state.repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the state's batch rows ``indices`` (integer or boolean)."""
        if self.state is not None:
            index = torch.as_tensor(indices, device=self.device).flatten()
            if index.dtype == torch.bool:
                index = index.nonzero().flatten()
            self.state = self.state.index_select(0, index)

    def crop(self, tokens_to_remove: int) -> None:
        """Crop nothing: a recurrent state has no per-token entries to drop.

        Raises:
            NotImplementedError: ``tokens_to_remove > 0`` (assisted/speculative decoding).
        """
        if tokens_to_remove:
            raise NotImplementedError(
                "a linear-attention layer's recurrent state cannot be cropped (assisted/speculative decoding "
                "needs rollback); generate without an assistant model"
            )

    def offload(self) -> None:
        """Keep the state where it is: it is small and of constant size."""
        pass  # the state is small and constant-size; it stays on its device

    def prefetch(self) -> None:
        """Nothing to fetch (see :meth:`offload`)."""
        pass


def student_cache(config, linear_layers: Sequence[bool]) -> Cache:
    """A cache for a student: :class:`RecurrentStateLayer` where ``linear_layers[i]``, else what
    ``DynamicCache(config=config)`` would use (full or sliding-window KV cache).

    Args:
        config: the teacher's (text) config.
        linear_layers: one bool per decoder layer.

    Raises:
        ValueError: ``linear_layers`` does not have one entry per layer.
    """
    cache = DynamicCache(config=config)
    if len(cache.layers) != len(linear_layers):
        raise ValueError(f"linear_layers has {len(linear_layers)} entries for a cache of {len(cache.layers)} layers")
    for i, linear in enumerate(linear_layers):
        if linear:
            cache.layers[i] = RecurrentStateLayer()
    return cache


def cache_nbytes(cache: Cache) -> int:
    """Bytes a generation cache holds: every layer's keys and values, or a linear layer's recurrent state.

    Args:
        cache: a transformers ``Cache`` (a teacher's ``DynamicCache``, or a student's from
            :func:`student_cache`).

    Returns:
        the total number of bytes of its tensors.
    """
    total = 0
    for layer in cache.layers:
        if isinstance(layer, RecurrentStateLayer):
            total += layer.nbytes
            continue
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


@torch.no_grad()
def prefill_cache_nbytes(model: torch.nn.Module, context: int) -> int:
    """Bytes of ``model``'s generation cache after a prefill of ``context`` tokens, one sequence: what decoding
    at that context keeps per sequence (a teacher's KV cache grows with ``context``; a student's recurrent state
    and window ring buffer do not).

    Args:
        model: a causal LM (teacher or :class:`~lit_dof.students.LitDofForCausalLM`), on its device.
        context: prompt length in tokens (≥ 1).

    Returns:
        :func:`cache_nbytes` of the cache the forward returns (bytes).

    Raises:
        ValueError: ``context`` < 1.
    """
    from lit_dof.interface import MODEL_CACHE_ARGUMENT

    if context < 1:
        raise ValueError(f"context must be at least 1 token, got {context}")
    device = next(model.parameters()).device
    ids = torch.zeros(1, context, dtype=torch.long, device=device)  # the bytes do not depend on the tokens
    return cache_nbytes(getattr(model(input_ids=ids, use_cache=True), MODEL_CACHE_ARGUMENT))
