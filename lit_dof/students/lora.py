"""Low-rank adaptation (LoRA, Hu et al. 2022) of a student's attention projections, through ``peft``.

The end-to-end phase may train, beside the feature maps, low-rank updates ΔW = (α/r)·BA of the teacher's
q/k/v/o projections — the second half of LoLCATs' recipe (Zhang et al. 2025, §3.2: attention transfer, then
LoRA). Adapters are injected with ``peft.inject_adapter_in_model`` (module names stay the model's own, so
checkpoints, sharding and the twins' names are unaffected), switched off whenever the student runs as its
teacher (:meth:`~lit_dof.students.LitDofForCausalLM.teacher_mode`, so
distillation targets stay the frozen teacher's), and merged into the plain weights before export, so an
exported student is an ordinary ``LitDofForCausalLM`` directory that loads without peft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


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


_FLAG = "_lit_dof_lora"


def add_lora(model: nn.Module, settings: LoRA) -> list[str]:
    """Add LoRA adapters (peft adapter ``"default"``, B initialised to 0, so the model is unchanged) to a
    transformers model — for a student, its wrapped teacher ``student.model``. Only the adapters' parameters
    are left trainable.

    Args:
        model: a ``transformers.PreTrainedModel``.
        settings: :class:`LoRA`.

    Returns:
        the names of the adapters' parameters (trainable).

    Raises:
        ImportError: peft is not installed. ValueError: no module matches ``target_modules`` (peft's message).
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=settings.target_modules, bias="none")  # fmt: skip
    inject_adapter_in_model(config, model)
    setattr(model, _FLAG, True)
    return [name for name, _ in model.named_parameters() if ".lora_" in name]


def has_adapters(model: nn.Module) -> bool:
    """True when :func:`add_lora` gave ``model`` adapters (and they have not been merged)."""
    return bool(getattr(model, _FLAG, False))


def set_adapters_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch every LoRA adapter of ``model`` on or off (off: the base layers alone). No-op without adapters."""
    if not has_adapters(model):
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.enable_adapters(enabled)


def merge_lora(model: nn.Module) -> int:
    """Merge every LoRA update into its base layer's weight and put the base layer back in its place, so the
    model holds plain modules again (W ← W + (α/r)·BA). No-op without adapters.

    Returns:
        the number of layers merged.
    """
    if not has_adapters(model):
        return 0
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module.get_base_layer())
            merged += 1
    setattr(model, _FLAG, False)
    return merged
