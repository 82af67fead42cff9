"""The student model: a teacher architecture with linear twins, as a transformers-native config/model pair.

``LitDofConfig`` (``model_type="lit_dof"``) records the teacher's architecture (``text_config``), the
per-layer feature dimensions, the feature-map class and which layers stay softmax; ``LitDofForCausalLM``
rebuilds the teacher architecture from it and re-attaches the twins, so a saved student loads without the
teacher files or the network. Both are registered with ``AutoConfig`` / ``AutoModelForCausalLM`` when
``lit_dof`` is imported::

    import lit_dof  # registers "lit_dof"
    from transformers import AutoModelForCausalLM
    student = AutoModelForCausalLM.from_pretrained("path/to/student")

Saving writes a model card (``README.md``, :mod:`lit_dof.students.card`) and ``auto_map`` with two small code
files that import the installed lit-dof (:mod:`lit_dof.students.remote_code`: plain transformers, ``pipeline`` and
``lm_eval --model hf`` load the folder with ``trust_remote_code=True``) in the same atomic step, and can push the
saved directory to the Hub (``save_pretrained(dir, push_to_hub=True, repo_id=...)``). The feature-map class
is looked up in a registry (:func:`~lit_dof.attention.register_feature_map`), never imported by name.

Generation: :meth:`LitDofForCausalLM.generate` (transformers' ``GenerationMixin``) gets a
:func:`~lit_dof.students.cache.student_cache` — a recurrent state for linear layers (constant memory),
a KV cache for softmax ones.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel

from lit_dof.attention import CausalLinearAttention, FeatureMap, FeatureMapFactory, SlidingWindow
from lit_dof.attention.feature_maps.registry import warn_if_unregistered
from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.attention.ops.linear.chunked import DEFAULT_CHUNK_SIZE
from lit_dof.interface import MODEL_CACHE_ARGUMENT, AttentionSlot
from lit_dof.io import atomic_directory
from lit_dof.students import integrity
from lit_dof.students.cache import student_cache
from lit_dof.students.card import HUB_KWARGS, push_folder, write_model_card
from lit_dof.students.config import LitDofConfig
from lit_dof.students.lora import adapters_enabled, set_adapters_enabled
from lit_dof.students.remote_code import write_remote_code
from lit_dof.students.surgery import (
    attach_linear_attention,
    feature_map_class,
    feature_map_spec,
    linear_layer_mask,
    linear_modules,
    resolve_feature_dims,
    set_softmax_layers,
    with_exact_heads,
)
from lit_dof.teacher.families import attention_layers, check_supported


class LitDofForCausalLM(PreTrainedModel, GenerationMixin):
    """A linearised (or hybrid) causal LM: the teacher architecture in ``self.model`` plus linear twins.

    Build one with :func:`linearize` (from a loaded teacher) or ``from_pretrained`` (a saved student).
    Forward and ``generate`` take and return what the teacher's do: ``input_ids (B, T)`` → logits
    ``(B, T, V)``.

    Args:
        config: :class:`LitDofConfig`.
        teacher: an already-loaded teacher to wrap in place (its weights are kept); ``None`` builds the
            architecture from ``config.text_config``.
        feature_map_factory: factory for fresh twins (default: the class in ``config.feature_map``).
        seed: per-layer seed of fresh twins' initial values (see
            :func:`~lit_dof.students.surgery.attach_linear_attention`); ``None``: the global RNG.
    """

    config_class = LitDofConfig
    base_model_prefix = "student"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _can_compile_fullgraph = False

    def __init__(
        self,
        config: LitDofConfig,
        teacher: PreTrainedModel | None = None,
        feature_map_factory: FeatureMapFactory | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(config)
        if config.text_config is None:
            raise ValueError("LitDofConfig.text_config (the teacher architecture) is required")
        self.model = teacher if teacher is not None else AutoModelForCausalLM.from_config(config.text_config)
        check_supported(self.model)
        if feature_map_factory is None:
            cls = feature_map_class(config.feature_map)
            kwargs = dict(config.feature_map.get("kwargs", {}))
            feature_map_factory = (lambda d, h, m: cls(d, h, m, **kwargs)) if kwargs else cls
        attach_linear_attention(
            self.model,
            feature_map_factory,
            config.feature_dims,
            softmax_layers=config.softmax_layers,
            share_kv_maps=config.share_kv_maps,
            chunk_size=config.chunk_size,
            sliding_window=SlidingWindow.from_dict(config.window_options),
            seed=seed,
        )
        if teacher is not None and getattr(teacher, "generation_config", None) is not None:
            self.generation_config = teacher.generation_config
        self.post_init()

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModel") -> None:
        """Do nothing. transformers marks a class loaded through ``trust_remote_code`` for an Auto class, and
        ``save_pretrained`` then copies the file defining it (here ``lit_dof/students/modeling.py``) into the saved
        folder; this class is the installed package's, and every saved student carries its own small code files
        instead (:mod:`lit_dof.students.remote_code`).

        Args:
            auto_class: the Auto class transformers would record (ignored).
        """

    # -- structure -----------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the teacher's weights (what ``save_pretrained`` records as ``config.dtype``); the
        feature maps are float32 whatever it is (:class:`~lit_dof.attention.FeatureMap`)."""
        twins = {id(p) for m in self.modules() if isinstance(m, FeatureMap) for p in m.parameters()}
        floats = (p.dtype for p in self.parameters() if p.is_floating_point() and id(p) not in twins)
        return next(floats, torch.float32)

    @property
    def linear_layers(self) -> list[bool]:
        """One bool per attention layer: True where it currently runs linear attention."""
        return linear_layer_mask(self.model)

    @property
    def feature_dims(self) -> list[int]:
        """M_s per attention layer (as configured)."""
        return list(self.config.feature_dims)

    def set_softmax_layers(self, layers: Iterable[int]) -> None:
        """Switch the listed layers to softmax and all other linearised layers to linear (no reload)."""
        self.config.softmax_layers = set_softmax_layers(self.model, layers)

    @contextlib.contextmanager
    def teacher_mode(self):
        """Within the block every layer runs the teacher's softmax attention (the student *is* the teacher:
        the projections are shared) and LoRA adapters, if any, are off — e.g. for the teacher forward of
        distillation."""
        saved = list(self.config.softmax_layers)
        adapters = adapters_enabled(self.model)  # False inside an enclosing teacher_mode: leave them off
        self.set_softmax_layers(range(len(self.config.feature_dims)))
        if adapters:
            set_adapters_enabled(self.model, False)
        try:
            yield self
        finally:
            self.set_softmax_layers(saved)
            if adapters:
                set_adapters_enabled(self.model, True)

    def linear_modules(self):
        """``{layer index: CausalLinearAttention}`` for every layer with a twin."""
        return linear_modules(self.model)

    def new_cache(self):
        """A generation cache: recurrent state for linear layers, KV cache for softmax ones."""
        return student_cache(self.config.text_config, self.linear_layers)

    def get_input_embeddings(self) -> nn.Module:
        """The teacher's token embedding."""
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replace the teacher's token embedding."""
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        """The teacher's LM head (``None`` where it has none)."""
        return self.model.get_output_embeddings()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (FeatureMap, CausalLinearAttention, AttentionSlot)):
            return  # lit-dof's twins are initialised by their constructors (or loaded)
        self.model._init_weights(module)

    # -- running -------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ):
        """The teacher's forward with linear layers; ``use_cache=True`` without a cache gets :meth:`new_cache`.

        ``cache`` is accepted as ``past_key_values=`` too (what ``generate`` passes before transformers 5.24);
        the teacher model gets it under the name its transformers takes
        (:data:`~lit_dof.interface.MODEL_CACHE_ARGUMENT`), so no call warns.
        """
        cache = kwargs.pop("past_key_values", cache)
        if use_cache and cache is None:
            cache = self.new_cache()
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **{MODEL_CACHE_ARGUMENT: cache},
            **kwargs,
        )

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs):
        # generate() would build a DynamicCache (growing keys for every layer); give it ours instead.
        if model_kwargs.get(MODEL_CACHE_ARGUMENT) is None and generation_config.use_cache is not False:
            if generation_config.cache_implementation not in (None, "dynamic"):
                raise ValueError(
                    f"cache_implementation={generation_config.cache_implementation!r} is not supported by lit-dof "
                    "students; leave it unset (linear layers keep a constant-size recurrent state)"
                )
            model_kwargs[MODEL_CACHE_ARGUMENT] = self.new_cache()
            return
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *, push_to_hub: bool = False, repo_id: str | None = None, **kwargs
    ) -> None:
        """``PreTrainedModel.save_pretrained`` plus a model card, atomically; then, optionally, a push to the Hub.

        Weights, ``config.json`` (with ``auto_map``), ``configuration_lit_dof.py`` / ``modeling_lit_dof.py``
        (:mod:`lit_dof.students.remote_code`) and ``README.md`` (:mod:`lit_dof.students.card`) are written into a
        temporary directory renamed into place, so ``save_directory`` is never half-written. With ``push_to_hub`` that
        final directory is uploaded as it is (:func:`~lit_dof.students.card.push_folder`).

        Args:
            save_directory: the student directory (replaced if it exists).
            push_to_hub: upload the saved directory to the Hugging Face Hub.
            repo_id: the Hub repository (default: the name of ``save_directory``, as transformers does).
            **kwargs: ``PreTrainedModel.save_pretrained``'s (e.g. ``state_dict``, ``max_shard_size``), and for the
                push :data:`~lit_dof.students.card.HUB_KWARGS` (``commit_message``, ``private``, ``token``, ...).
        """
        hub = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
        target = Path(save_directory)
        repo_id = repo_id or target.resolve().name
        self._save_with_card(target, repo_id if push_to_hub else f"path/to/{target.resolve().name}", **kwargs)
        if push_to_hub:
            push_folder(target, repo_id, **hub)

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """Save into a temporary directory and upload it, so the Hub gets the same files and model card as
        :meth:`save_pretrained` writes (transformers' own ``push_to_hub`` would replace the card).

        Args:
            repo_id: the Hub repository.
            **kwargs: those of :meth:`save_pretrained`, hub keywords included.

        Returns:
            The repository id the Hub resolved (namespace included).
        """
        hub = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / repo_id.rpartition("/")[2]
            self._save_with_card(folder, repo_id, **kwargs)
            return push_folder(folder, repo_id, **hub)

    def _save_with_card(self, target: Path, model_id: str, **kwargs) -> None:
        """Weights, config (with ``auto_map``), the two code files of :mod:`lit_dof.students.remote_code` and the
        model card into a temporary directory renamed to ``target``."""
        warn_if_unregistered((self.config.feature_map or {}).get("class"), stacklevel=4)
        with atomic_directory(target) as tmp:
            super().save_pretrained(tmp, **kwargs)
            write_remote_code(tmp)
            write_model_card(tmp, model_id=model_id)


def linearize(
    model: PreTrainedModel,
    feature_map_factory: FeatureMapFactory,
    feature_dims: int | Sequence[int],
    *,
    sliding_window: SlidingWindow = SlidingWindow(),
    softmax_layers: Iterable[int] = (),
    seed: int | None = None,
    share_kv_maps: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    exact_heads: Mapping[int, Sequence[int]] | None = None,
) -> LitDofForCausalLM:
    """Replace every softmax attention layer of ``model`` by linear attention (paper §3; METHOD.md §1).

    The teacher's q/k/v/o projections, rotary embeddings and GQA layout are reused as they are; each layer
    gets a feature map from ``feature_map_factory(head_dim, num_heads, feature_dims[s])`` (num_heads = Hk
    with ``share_kv_maps``). ``model`` is modified in place and wrapped (its weights are shared, not copied).

    Args:
        model: a loaded teacher of a supported family.
        feature_map_factory: any callable ``(head_dim, num_heads, feature_dim) -> FeatureMap`` — every
            feature-map class is one (``linearize(m, PerformerFeatureMap, dims)``).
        feature_dims: M_s per attention layer, or one int for all (the "Fix" baseline: the head size).
        sliding_window: :class:`~lit_dof.attention.SlidingWindow`: window 0 (default) for linear attention,
            w ≥ 1 for sliding-window + linear attention with the sinks, far term and decay it sets.
        softmax_layers: layers kept softmax (hybrids); switch later with ``set_softmax_layers``.
        seed: makes the twins' initial values independent of the global RNG, one seed per layer.
        share_kv_maps: one φ per KV head (default) or one per query head.
        chunk_size: chunk size of the parallel form.
        exact_heads: ``{layer: [KV head, …]}`` kept exact — full causal softmax, a growing KV cache — inside
            otherwise linearised layers (:func:`~lit_dof.students.surgery.with_exact_heads`: their M becomes 0);
            needs ``share_kv_maps``.

    Returns:
        :class:`LitDofForCausalLM`.

    Raises:
        UnsupportedModelError: the model's family is not supported (the message lists the supported ones).
        ValueError: a feature dim ≤ 0 (< 0 for a KV head), a wrong number of dims, a layer index or exact KV head
            out of range; a model that is already a student.
    """
    if isinstance(model, LitDofForCausalLM):
        raise ValueError("model is already a lit-dof student; pass its teacher or use set_softmax_layers()")
    layers = attention_layers(model)
    dims = resolve_feature_dims(feature_dims, len(layers))
    if exact_heads:
        dims = with_exact_heads(dims, exact_heads, [a.num_kv_heads for a in layers])
    config = LitDofConfig(
        text_config=model.config.get_text_config(decoder=True),
        feature_dims=dims,
        softmax_layers=set(softmax_layers),
        share_kv_maps=share_kv_maps,
        chunk_size=chunk_size,
        teacher=getattr(model.config, "name_or_path", None) or None,
        window_options=sliding_window,
    )
    student = LitDofForCausalLM(config, teacher=model, feature_map_factory=feature_map_factory, seed=seed)
    twins = [
        g for t in student.linear_modules().values() for g in (t.twins if isinstance(t, HeadGroupedAttention) else [t])
    ]
    if twins:  # record what the factory built (class + behaviour kwargs), so load_student can rebuild it
        student.config.feature_map = feature_map_spec(twins[0].feature_map)
    return student


def load_student(path: str | os.PathLike, *, check_finite: bool = True, **kwargs) -> LitDofForCausalLM:
    """Load a student saved with ``save_pretrained`` (no teacher files, no network).

    The teacher's weights load in the recorded ``config.dtype`` (the dtype the student was trained and saved
    in, e.g. ``bfloat16`` after a ``bf16-true`` fit) unless ``dtype`` says otherwise; the feature maps load in
    float32 whatever ``dtype`` is, exactly as saved (:class:`~lit_dof.attention.FeatureMap`). The folder's files
    are checked first and the loaded weights after (:mod:`lit_dof.students.integrity`).

    Args:
        path: the student directory.
        check_finite: refuse a student with NaN / infinite parameters or buffers, or whose 8-token probe forward
            gives non-finite logits (one ``aminmax`` reduction per tensor and one short forward); ``False``
            loads it anyway, e.g. to inspect it.
        **kwargs: passed to ``from_pretrained`` (e.g. ``dtype``, ``device_map``).

    Raises:
        FileNotFoundError: no ``config.json`` in ``path``. ValueError: not a lit-dof student directory.
        CorruptModelFileError: a damaged ``config.json`` (invalid JSON, not an object, no ``model_type``) or a
            truncated / corrupt safetensors file; the message names the file and says to re-export the student.
        NonFiniteStudentError: with ``check_finite``, non-finite weights (named) or probe logits.
    """
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{config_file} does not exist: pass a directory written by student.save_pretrained()")
    model_type = integrity.check_student_config(path)["model_type"]
    config = LitDofConfig.from_pretrained(path) if model_type == LitDofConfig.model_type else None
    if config is None or config.text_config is None:
        raise ValueError(f"{path} is not a lit-dof student (model_type {model_type!r})")
    integrity.check_student_weights(path)
    student = LitDofForCausalLM.from_pretrained(path, **kwargs)
    if check_finite:
        integrity.check_finite(student[0] if isinstance(student, tuple) else student, path)  # output_loading_info
    return student


AutoConfig.register(LitDofConfig.model_type, LitDofConfig, exist_ok=True)
AutoModelForCausalLM.register(LitDofConfig, LitDofForCausalLM, exist_ok=True)
