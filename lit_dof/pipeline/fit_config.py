"""What the tools around a fit (``lit-dof compare``, ``lit-dof hybrid``) read of a ``lit-dof fit`` config — a config
file, or the ``config.yaml`` a fit saves beside its run: the steps, the batch shape, the teacher, the layer loss, the
end-to-end tail and the feature-dimension planner, as :class:`FitConfig`. The YAML
is read safely and validated by pydantic (a :class:`pydantic.TypeAdapter` over these standard dataclasses); every
other key is ignored, and a key the file does not set is ``None``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_dof.records import parse_record

FIXED_PLANNER = "FixedPlanner"
"""The class name of the planner that gives every layer the budget C (the ``fix`` strategy)."""


@dataclass
class PlannerArgs:
    """A planner's ``init_args`` as far as the comparison reads them: the allocation ``strategy``."""

    strategy: str | None = None


@dataclass
class PlannerConfig:
    """``model.init_args.planner`` written as a mapping: its ``class_path`` (``None``: only ``init_args``, the class
    set before kept) and ``init_args``."""

    class_path: str | None = None
    init_args: PlannerArgs = field(default_factory=PlannerArgs)


def named_planner(planner: PlannerConfig | str | dict | None) -> str | None:
    """The class a value of ``model.init_args.planner`` names — a class path, or a mapping with ``class_path``
    (``None``: a mapping with only ``init_args``, or nothing).

    Raises:
        ValueError: a value that is neither (pydantic's error).
    """
    planner = parse_record(PlannerConfig | str | None, planner)
    return planner.class_path if isinstance(planner, PlannerConfig) else planner


@dataclass
class ModelArgs:
    """``model.init_args``: the teacher (name or path), the planner (a class path, or a mapping), the layer loss (a
    name, or a ``class_path`` mapping) and the share of the steps spent on the end-to-end tail."""

    teacher: str | None = None
    planner: PlannerConfig | str | None = None
    loss: str | dict[str, Any] | None = "softmax"
    finetune_fraction: float | None = None


@dataclass
class ModelConfig:
    """``model``."""

    init_args: ModelArgs = field(default_factory=ModelArgs)


@dataclass
class DataArgs:
    """``data.init_args``: sequences per step and tokens per sequence."""

    batch_size: int | None = None
    seq_len: int | None = None


@dataclass
class DataConfig:
    """``data``."""

    init_args: DataArgs = field(default_factory=DataArgs)


@dataclass
class TrainerConfig:
    """``trainer``: optimizer steps."""

    max_steps: int | None = None


@dataclass
class AllocatorConfig:
    """``allocator``: the allocation of configs written before the planners (its ``strategy``)."""

    strategy: str | None = None


@dataclass
class FitConfig:
    """The parts of a fit config the tools read (see the module)."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    allocator: AllocatorConfig | None = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> FitConfig:
        """Read a YAML config (``yaml.safe_load``: no tag builds an object).

        Raises:
            FileNotFoundError: no such file. yaml.YAMLError: not YAML. ValueError: a key of the wrong type
                (pydantic names it).
        """
        import yaml

        return parse_record(cls, yaml.safe_load(Path(path).read_text()) or {})

    @property
    def teacher(self) -> str | None:
        """``model.init_args.teacher``."""
        return self.model.init_args.teacher

    @property
    def tokens_per_step(self) -> int | None:
        """Tokens per optimizer step: batch size × sequence length (``None`` when either is unset)."""
        data = self.data.init_args
        return data.batch_size * data.seq_len if data.batch_size and data.seq_len else None

    @property
    def planner_class(self) -> str | None:
        """The planner class this config names, as written (``None``: it names none)."""
        return named_planner(self.model.init_args.planner)

    @property
    def strategy(self) -> str | None:
        """The allocation strategy: its planner's (``fix`` for a ``FixedPlanner``), or its ``allocator`` group's
        (configs from before the planners); ``None`` when it names none."""
        planner = self.model.init_args.planner
        if not isinstance(planner, PlannerConfig):
            return self.allocator.strategy if self.allocator else None
        if (planner.class_path or "").endswith(FIXED_PLANNER):
            return "fix"
        return planner.init_args.strategy
