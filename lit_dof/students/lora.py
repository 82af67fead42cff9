"""Low-rank adaptation (LoRA, Hu et al. 2022) of a student's attention projections, through ``peft``.

The end-to-end phase may train, beside the feature maps, low-rank updates ΔW = (α/r)·BA of the teacher's
q/k/v/o projections — the second half of LoLCATs' recipe (Zhang et al. 2025, §3.2: attention transfer, then
LoRA). Adapters are injected with ``peft.inject_adapter_in_model`` (module names stay the model's own, so
checkpoints, sharding and the twins' names are unaffected), switched off whenever the student runs as its
teacher (:meth:`~lit_dof.students.LitDofForCausalLM.teacher_mode`, so
distillation targets stay the frozen teacher's), and folded into the plain weights of the exported state dict
(:func:`merged_state_dict`), so an exported student is an ordinary ``LitDofForCausalLM`` directory that loads
without peft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from lit_dof.extras import require
from lit_dof.precision import Float32Parameters


@dataclass
class LoRA:
    """LoRA settings of the end-to-end phase.

    Attributes:
        rank: r, the rank of each update (≥ 1).
        alpha: α; the update is scaled by α / r.
        dropout: dropout on the adapters' input during training.
        target_modules: names of the projections to adapt (suffixes of module names, e.g. ``q_proj``);
            ``None``: peft's default for the model family.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")

    def parameter_bytes(self, model: nn.Module) -> int:
        """Bytes of the adapters :func:`add_lora` gives ``model``: float32 A ``(r, in)`` and B ``(out, r)`` of every
        module these settings target, counted by injecting them (``lit-dof plan`` passes a teacher built on the meta
        device, which this changes: pass a model you no longer need).

        Raises:
            ImportError: peft is not installed. ValueError: no module matches ``target_modules``.
        """
        names = set(add_lora(model, self))
        return sum(p.numel() * p.element_size() for name, p in model.named_parameters() if name in names)


_FLAG = "_lit_dof_lora"


def _peft_config(settings: LoRA, target_modules: list[str] | None = None):
    """peft's ``LoraConfig`` of ``settings`` (with ``target_modules`` instead of its own, when given)."""
    from peft import LoraConfig

    targets = settings.target_modules if target_modules is None else target_modules
    return LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=targets, bias="none"
    )


def check_targets(model: nn.Module, settings: LoRA) -> None:
    """Check that every name of ``settings.target_modules`` matches a module of ``model`` by peft's own rule
    (``check_target_module_exists``), so that a recipe written for one family fails on another before any
    expensive work rather than at :func:`add_lora`.

    Raises:
        ValueError: a target matches no module; the message lists the model's weight layers.
        MissingExtraError: peft is not installed (the ``train`` extra).
    """
    require("peft", "LoRA (model.init_args.lora)")
    from peft.tuners.tuners_utils import check_target_module_exists

    if settings.target_modules is None:
        return
    names = [name for name, _ in model.named_modules()]
    missing = [
        t
        for t in settings.target_modules
        if not any(check_target_module_exists(_peft_config(settings, [t]), n) for n in names)
    ]
    if missing:
        leaves = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in model.named_modules()
                if not list(module.children()) and hasattr(module, "weight")
            }
        )
        raise ValueError(
            f"LoRA target_modules {missing} match no module of this {type(model).__name__} (its weight layers: "
            f"{leaves}): set --model.init_args.lora.target_modules for this family, or --model.init_args.lora=null"
        )


def add_lora(model: nn.Module, settings: LoRA) -> list[str]:
    """Add LoRA adapters (peft adapter ``"default"``, B initialised to 0, so the model is unchanged) to a
    transformers model — for a student, its wrapped teacher ``student.model``. Only the adapters' parameters
    are left trainable. They are float32 whatever the model's dtype and stay so under half-precision conversions
    (optimizer master weights, like the feature maps': lit_dof.precision.Float32Parameters).

    Args:
        model: a ``transformers.PreTrainedModel``.
        settings: :class:`LoRA`.

    Returns:
        the names of the adapters' parameters (trainable).

    Raises:
        MissingExtraError: (an ``ImportError``) peft is not installed (the ``train`` extra). ValueError: no module
            matches ``target_modules`` (peft's message).
    """
    require("peft", "LoRA (model.init_args.lora)")
    from peft import inject_adapter_in_model

    inject_adapter_in_model(_peft_config(settings), model)
    for _, layer in _tuner_layers(model):  # float32 master weights whatever the teacher's dtype, as the feature maps
        for adapter in [*layer.lora_A.values(), *layer.lora_B.values()]:
            if type(adapter) is nn.Linear:
                adapter.float().__class__ = _Float32Linear
    setattr(model, _FLAG, True)
    return [name for name, _ in model.named_parameters() if ".lora_" in name]


class _Float32Linear(Float32Parameters, nn.Linear):
    """An adapter's ``nn.Linear`` whose float32 weights stay float32 under ``.to(torch.bfloat16)`` and Lightning's
    ``bf16-true`` (peft casts its input to the weight's dtype and its output back to the base layer's)."""


def has_adapters(model: nn.Module) -> bool:
    """True when :func:`add_lora` gave ``model`` adapters (and they have not been merged)."""
    return bool(getattr(model, _FLAG, False))


def _tuner_layers(model: nn.Module) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(name, module) for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)]


def adapters_enabled(model: nn.Module) -> bool:
    """True when ``model`` has LoRA adapters and they are on."""
    return has_adapters(model) and not any(module.disable_adapters for _, module in _tuner_layers(model))


def set_adapters_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch every LoRA adapter of ``model`` on or off (off: the base layers alone); which parameters
    require gradients is left as it was (peft's switch would change it). No-op without adapters."""
    if not has_adapters(model):
        return
    trainable = {p: p.requires_grad for p in model.parameters()}
    for _, module in _tuner_layers(model):
        module.enable_adapters(enabled)
    for p, flag in trainable.items():
        p.requires_grad_(flag)


def merged_state_dict(model: nn.Module, state: dict | None = None) -> dict:
    """``model.state_dict()`` with every LoRA update folded into its base weight (W + (α/r)·BA under the plain
    layer's own key) and the adapter entries dropped: what a model without adapters would hold. The model is
    not changed (it keeps training or validating with its adapters).

    Args:
        model: the model with adapters.
        state: its full state dict when ``model``'s own holds shards (FSDP2: ``get_model_state_dict`` with
            ``full_state_dict``); ``None``: ``model.state_dict()``. The adapters are read from ``model``.

    Returns:
        the state dict (its tensors detached).
    """
    state = {k: v.detach() for k, v in (model.state_dict() if state is None else state).items()}
    for name, module in _tuner_layers(model):
        prefix = f"{name}." if name else ""
        weight = state.pop(f"{prefix}base_layer.weight")
        for adapter in module.active_adapters:
            weight = weight + module.get_delta_weight(adapter).detach().to(weight.device, weight.dtype)
        state[f"{prefix}weight"] = weight
        if f"{prefix}base_layer.bias" in state:
            state[f"{prefix}bias"] = state.pop(f"{prefix}base_layer.bias")
        for key in [k for k in state if k.startswith(f"{prefix}lora_")]:
            del state[key]
    return state
