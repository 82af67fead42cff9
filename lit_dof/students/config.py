"""``LitDofConfig``: what a saved lit-dof student records — the teacher architecture, the feature dimensions and
feature map, the softmax layers and the attention options of its twins (:mod:`lit_dof.students.modeling` builds
the model from it)."""

from __future__ import annotations

from typing import Iterable, Sequence

from transformers import AutoConfig, PretrainedConfig


class LitDofConfig(PretrainedConfig):
    """Configuration of a lit-dof student.

    Args:
        text_config: the teacher's config (a ``PretrainedConfig`` or its dict with ``model_type``).
        feature_dims: M_s per attention layer, or a list of M per KV head for a layer with per-head dims
            (sliding-window layers' entries are unused).
        feature_map: ``{"class": "pkg.module.Class", "kwargs": {...}}`` (see
            :func:`~lit_dof.students.surgery.feature_map_spec`).
        softmax_layers: layer indices that run softmax attention.
        share_kv_maps: one feature map per KV head (default) or per query head.
        chunk_size: chunk size of the parallel linear-attention form (tokens).
        teacher: where the teacher came from (provenance only; never loaded).
        window: 0 for pure linear attention, w ≥ 1 for sliding-window + linear attention (tokens).
        sink_tokens: first tokens always attended exactly (sliding window only).
        far_term: the sliding-window layers keep their linear far term (``False``: window and sinks alone).
        learn_mix: the sliding-window layers have a learned per-head log-weight of the far term.
        far_decay: the sliding-window layers' far-term decay length τ in tokens (``None``: no decay).
        learn_decay: the decay rates are trained (else fixed at 1/τ).
    """

    model_type = "lit_dof"
    sub_configs = {"text_config": AutoConfig}

    def __init__(
        self,
        text_config: PretrainedConfig | dict | None = None,
        feature_dims: Sequence[int] | None = None,
        feature_map: dict | None = None,
        softmax_layers: Iterable[int] = (),
        share_kv_maps: bool = True,
        chunk_size: int = 64,
        teacher: str | None = None,
        window: int = 0,
        sink_tokens: int = 0,
        far_term: bool = True,
        learn_mix: bool = True,
        far_decay: float | None = None,
        learn_decay: bool = False,
        **kwargs,
    ) -> None:
        if isinstance(text_config, dict):
            text_config = dict(text_config)
            text_config = AutoConfig.for_model(text_config.pop("model_type"), **text_config)
        self.text_config = text_config
        self.feature_dims = [
            [int(x) for x in m] if isinstance(m, (list, tuple)) else int(m) for m in feature_dims or []
        ]
        self.feature_map = dict(feature_map or {"class": "lit_dof.attention.feature_maps.prf.LearnedPRF", "kwargs": {}})
        self.softmax_layers = sorted(int(i) for i in softmax_layers)
        self.share_kv_maps = bool(share_kv_maps)
        self.chunk_size = int(chunk_size)
        self.teacher = teacher
        self.window, self.sink_tokens = int(window), int(sink_tokens)
        self.far_term, self.learn_mix = bool(far_term), bool(learn_mix)
        self.far_decay, self.learn_decay = (None if far_decay is None else float(far_decay)), bool(learn_decay)
        kwargs.setdefault("tie_word_embeddings", False)  # the wrapped teacher ties its own embeddings
        super().__init__(**kwargs)
