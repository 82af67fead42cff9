"""Which Hugging Face causal LMs lit-dof supports, and where their attention layers are.

lit-dof never copies modeling code: a supported model is one whose attention modules call transformers'
attention interface (``ALL_ATTENTION_FUNCTIONS``) with post-RoPE queries and keys, so that the
``"lit_dof"`` implementation (:mod:`lit_dof.interface`) sees exactly what softmax attention would.
The families below are the ones tested (tiny random configs for all, real weights where available).
Sliding-window layers (Gemma-3, Qwen2 with ``use_sliding_window``) are reported but stay softmax: their
attention is already local and cheap, and linear attention would change what they can see.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

SUPPORTED_FAMILIES: dict[str, str] = {
    "llama": "Llama / SmolLM2 / TinyStories (GQA, RoPE)",
    "mistral": "Mistral (GQA, RoPE)",
    "qwen2": "Qwen2 (GQA, RoPE, q/k/v bias)",
    "gpt2": "GPT-2 (fused c_attn, learned positions)",
    "gpt_neox": "GPT-NeoX / Pythia (fused qkv, partial rotary)",
    "gemma3_text": "Gemma-3 text (q/k norm, sliding-window layers stay softmax)",
}
"""``config.model_type`` → description of the families lit-dof supports."""


class UnsupportedModelError(ValueError):
    """The model has no attention layers lit-dof can linearise."""


@dataclass(frozen=True)
class AttentionLayer:
    """One self-attention layer of a teacher.

    Attributes:
        index: decoder layer index (``module.layer_idx``).
        module: the teacher's attention module.
        head_dim: d. num_heads: Hq. num_kv_heads: Hk.
        sliding_window: window size in tokens for a sliding-window layer (stays softmax), else ``None``.
    """

    index: int
    module: nn.Module
    head_dim: int
    num_heads: int
    num_kv_heads: int
    sliding_window: int | None

    @property
    def linearizable(self) -> bool:
        """False for sliding-window layers, which stay softmax."""
        return self.sliding_window is None


def text_config(model: nn.Module):
    """The decoder's text config of a causal LM (``config.get_text_config(decoder=True)``)."""
    return model.config.get_text_config(decoder=True)


def check_supported(model: nn.Module) -> str:
    """Return the model's ``model_type`` if supported.

    Raises:
        UnsupportedModelError: naming the model class and the supported families.
    """
    config = getattr(model, "config", None)
    model_type = getattr(text_config(model), "model_type", None) if config is not None else None
    if model_type not in SUPPORTED_FAMILIES:
        families = ", ".join(f"{k} ({v})" for k, v in SUPPORTED_FAMILIES.items())
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type={model_type!r}) has no attention layers lit-dof supports. "
            f"Supported families: {families}. Other transformers models whose attention calls "
            "ALL_ATTENTION_FUNCTIONS may work; add their model_type to lit_dof.teacher.families.SUPPORTED_FAMILIES "
            "and run the family tests."
        )
    return model_type


OUTPUT_PROJECTIONS = ("o_proj", "c_proj", "dense")
"""Attribute names of an attention module's output projection (Llama / Mistral / Qwen2 / Gemma-3, GPT-2,
GPT-NeoX), tried in this order."""


def output_projection(module: nn.Module) -> nn.Module:
    """An attention module's output projection: the map from its concatenated head outputs ``(…, Hq·D)`` to the
    residual stream.

    Raises:
        UnsupportedModelError: the module has none of :data:`OUTPUT_PROJECTIONS`.
    """
    for name in OUTPUT_PROJECTIONS:
        projection = getattr(module, name, None)
        if isinstance(projection, nn.Module):
            return projection
    raise UnsupportedModelError(
        f"{type(module).__name__} has no output projection named {' / '.join(OUTPUT_PROJECTIONS)}: add its name to "
        "lit_dof.teacher.families.OUTPUT_PROJECTIONS"
    )


def has_rotary_positions(model) -> bool:
    """Whether the model encodes positions by rotating q and k (RoPE: ``rope_parameters`` or ``rope_theta`` in its
    text config), so that attention depends on relative positions only; ``False`` for learned absolute positions
    (GPT-2). ``model`` may also be its ``PretrainedConfig`` (read without weights)."""
    config = text_config(model) if isinstance(model, nn.Module) else model.get_text_config(decoder=True)
    return getattr(config, "rope_parameters", None) is not None or getattr(config, "rope_theta", None) is not None


def attention_layers(model: nn.Module) -> list[AttentionLayer]:
    """The self-attention layers of a supported causal LM, in layer order.

    Raises:
        UnsupportedModelError: unsupported family, or no attention modules found.
    """
    check_supported(model)
    config = text_config(model)
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    layers = []
    for module in model.modules():
        if not type(module).__name__.endswith("Attention") or getattr(module, "layer_idx", None) is None:
            continue
        if not getattr(module, "is_causal", True):
            continue  # cross-attention or bidirectional
        head_dim = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
        window = getattr(module, "sliding_window", None)
        layers.append(AttentionLayer(module.layer_idx, module, int(head_dim), num_heads, num_kv_heads, window))
    if not layers:
        raise UnsupportedModelError(f"found no causal self-attention modules in {type(model).__name__}")
    layers.sort(key=lambda layer: layer.index)
    if [layer.index for layer in layers] != list(range(len(layers))):
        raise UnsupportedModelError(f"attention layer indices of {type(model).__name__} are not 0..L-1")
    return layers
