"""``LitDofConfig``: what a saved lit-dof student records — the teacher architecture, the feature dimensions and
feature map, the softmax layers and the attention options of its twins (:mod:`lit_dof.students.modeling` builds
the model from it)."""

from __future__ import annotations

from dataclasses import fields
from typing import Iterable, Sequence

from transformers import AutoConfig, PretrainedConfig

from lit_dof.attention.layers.window_options import SlidingWindow
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE


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
        window_options: the twins' :class:`~lit_dof.attention.SlidingWindow` (or its dict): window 0 for pure
            linear attention, w ≥ 1 for sliding-window + linear attention. Stored as a dict under this name, not
            ``sliding_window``: transformers reads an int ``config.sliding_window`` (Mistral's) when it builds
            caches and masks. A ``config.json`` written before it existed holds the same six fields at the top
            level; they are read here.
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
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        teacher: str | None = None,
        window_options: SlidingWindow | dict | None = None,
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
        if not isinstance(window_options, SlidingWindow):
            flat = {f.name: kwargs.pop(f.name) for f in fields(SlidingWindow) if f.name in kwargs}  # older files
            window_options = SlidingWindow.from_dict(window_options or flat)
        self.window_options = window_options.to_dict()
        kwargs.setdefault("tie_word_embeddings", False)  # the wrapped teacher ties its own embeddings
        super().__init__(**kwargs)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig") -> None:
        """Do nothing: transformers marks a configuration class loaded through ``trust_remote_code`` so that saving
        copies the file defining it into the folder; this class is the installed lit-dof's, and a saved student
        carries its own small code files instead (lit_dof.students.remote_code).

        Args:
            auto_class: the Auto class transformers would record (ignored).
        """
