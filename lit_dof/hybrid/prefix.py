"""Prefix caching for hybrid search (Distill-then-Replace, arXiv 2601.11667 §3.3: "layers before the first
replaced one compute exactly the teacher's hidden states").

A hybrid whose first linear layer is f has, at the input of decoder layer f, the teacher's hidden state.
:class:`PrefixCache` stores the teacher's hidden states at every depth once (one forward with
``output_hidden_states``) and :func:`forward_from` runs only decoder layers f…L−1 from a cached state: the
layers before f are swapped for a pass-through for the duration of the call and a forward pre-hook on
layer f substitutes the cached input. Embeddings, masks and position embeddings are still computed by the
model's own forward (cheap), so this works for every family whose decoder layers take the hidden state as
their first argument and return it (transformers 5: Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, Gemma-3).
A search round then costs (L − f)/L of a full forward per candidate.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer ``ModuleList`` of a causal LM (the list whose entries are the model's
    ``_no_split_modules`` class).

    Raises:
        ValueError: no such list (names the model class).
    """
    classes = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and type(module[0]).__name__ in classes:
            return module
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (no ModuleList of {sorted(classes)})")


class _PassThrough(nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


@contextlib.contextmanager
def start_at(model: nn.Module, depth: int, hidden_states: torch.Tensor) -> Iterator[None]:
    """Within the context, a forward of ``model`` skips decoder layers ``< depth`` and feeds
    ``hidden_states`` ``(B, T, hidden)`` to layer ``depth`` (its usual input).

    Raises:
        ValueError: ``depth`` outside ``[0, L)``.
    """
    layers = decoder_layers(model)
    if not 0 <= depth < len(layers):
        raise ValueError(f"depth must be in [0, {len(layers)}), got {depth}")
    saved = [layers[i] for i in range(depth)]

    def substitute(module, args, kwargs):
        if args:
            return (hidden_states, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden_states}

    handle = layers[depth].register_forward_pre_hook(substitute, with_kwargs=True)
    try:
        for i in range(depth):
            layers[i] = _PassThrough()
        yield
    finally:
        for i, layer in enumerate(saved):
            layers[i] = layer
        handle.remove()


class PrefixCache:
    """The teacher's hidden states at every decoder depth for a fixed list of batches.

    Args:
        model: a :class:`~lit_dof.students.LitDofForCausalLM` (its teacher mode gives the teacher's states)
            or any causal LM (then its own states, e.g. a teacher).
        batches: ``[{"input_ids": (B, T), "attention_mask"?: (B, T)}, ...]``.
        dtype: storage dtype (float32: exact reuse; bfloat16 halves the memory, approximately).

    Memory: (L + 1) × tokens × hidden × bytes(dtype).
    """

    def __init__(self, model: nn.Module, batches: list[dict], dtype: torch.dtype = torch.float32) -> None:
        self.batches = batches
        self.states: list[tuple[torch.Tensor, ...]] = []
        teacher_mode = getattr(model, "teacher_mode", None)
        with torch.no_grad(), teacher_mode() if teacher_mode else contextlib.nullcontext():
            for batch in batches:
                out = model(**batch, use_cache=False, output_hidden_states=True)
                self.states.append(tuple(h.to(dtype) for h in out.hidden_states))  # L + 1 entries

    def hidden(self, batch_index: int, depth: int) -> torch.Tensor:
        """The teacher's input to decoder layer ``depth`` for batch ``batch_index``: ``(B, T, hidden)``."""
        return self.states[batch_index][depth]

    def logits(self, model: nn.Module, batch_index: int, depth: int) -> torch.Tensor:
        """``model``'s logits ``(B, T, V)`` for batch ``batch_index``, computing only layers ``depth``…L−1
        (layers before ``depth`` must be softmax in ``model``'s current hybrid configuration)."""
        batch = self.batches[batch_index]
        reference = next(model.parameters())
        hidden = self.hidden(batch_index, depth).to(reference.dtype)
        with torch.no_grad(), start_at(model, depth, hidden):
            return model(**batch, use_cache=False).logits
