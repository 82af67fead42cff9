"""The help screens of ``lit-dof fit|validate|test|predict|plan``: what a user reads first, and short class names.

* :data:`USAGE` — a usage line of a few options instead of LightningCLI's 50-line list of every option, so the
  screen opens with the command's description, which names ``--help-model``.
* :class:`HelpModel` — ``--help-model [CLASS]``: the options of the model class (the student's own: teacher,
  feature map, planner, sliding window, LoRA, learning rates), which ``--help`` only lists as ``--model``;
  the same screen as ``--model.help CLASS``, with CLASS defaulting to the configured model, else
  :data:`DEFAULT_MODEL`.
* :func:`import_phases` — imports lit-dof's phases and data modules so that jsonargparse resolves short class
  names (``--model.help LayerwiseDistillation``, ``class_path: WikipediaDataModule``): it looks a name up among the
  imported subclasses of the option's base class.
* :class:`LitDofArgumentParser` — LightningCLI's parser with :class:`~lit_dof.help_text.PlainHelpFormatter`, and a
  title of its own for the group of the trainer method's arguments.
* :func:`finish_help` — adds ``--help-model``, and group titles that say what the group is where Lightning's
  docstrings do not.
"""

from __future__ import annotations

import argparse
import importlib

from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser

from lit_dof.commands import COMMANDS, PROG
from lit_dof.help_text import PlainHelpFormatter

DEFAULT_MODEL = "lit_dof.pipeline.layerwise.LayerwiseDistillation"
"""The model class of the shipped configs, whose options ``--help-model`` shows when none is configured."""

PHASE_MODULES = (
    "lit_dof.pipeline.layerwise",
    "lit_dof.pipeline.direct",
    "lit_dof.pipeline.capture",
    "lit_dof.evaluation.finetune",
    "lit_dof.data.datamodule",
    "lit_dof.evaluation.finetune_data",
)
"""The modules of every ``model:`` and ``data:`` class lit-dof ships (imported to list their classes and help)."""

USAGE = "%(prog)s [-h] [--help-model [CLASS]] [-c CONFIG] [--KEY VALUE ...]"
"""The usage line of the LightningCLI commands (``%(prog)s``: ``lit-dof [options] fit``)."""

HELP_MODEL = (
    "The student's own options (teacher, feature map, planner, sliding window, LoRA, learning rates): "
    f"{PROG} COMMAND --help-model."
)
"""The sentence of every LightningCLI command's description that names ``--help-model``."""

GROUP_TITLES = {
    "model": "The model (a lit-dof phase; its options: --help-model CLASS)",
    "data": "The data (WikipediaDataModule or MultipleChoiceDataModule; its options: --data.help CLASS)",
    "optimizer": "Refused when set (each lit-dof phase builds its own optimizers)",
    "lr_scheduler": "Refused when set (each lit-dof phase builds its own learning-rate schedule)",
}
"""Titles of the groups whose Lightning docstring says nothing useful here or is cut mid-sentence."""


def import_phases() -> None:
    """Import :data:`PHASE_MODULES`, so that jsonargparse knows their classes by their short names."""
    for name in PHASE_MODULES:
        importlib.import_module(name)


def command_kwargs(name: str) -> dict[str, str]:
    """The parser settings of the LightningCLI command ``name`` (or ``plan``): its description and usage line.

    Args:
        name: ``fit``, ``validate``, ``test``, ``predict`` or ``plan``.

    Returns:
        ``{"description", "usage"}``.
    """
    description = f"{COMMANDS[name]} {HELP_MODEL.replace('COMMAND', 'fit' if name == 'plan' else name)}"
    return {"description": description, "usage": USAGE}


class LitDofArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with help text as a terminal shows it (:class:`~lit_dof.help_text.PlainHelpFormatter`,
    unless another ``formatter_class`` is given), also for the screens of ``--<key>.help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_method_arguments(self, class_type: type, method_name: str, *args, **kwargs) -> list[str]:
        """Add the arguments of ``class_type.method_name`` as jsonargparse does; the group of a trainer method's
        arguments (``--ckpt_path``, …) is titled ``Trainer.<method>'s own options`` instead of the first line of
        Lightning's docstring, which can end mid-sentence (``predict``'s: "… Useful to").

        Returns:
            the names of the arguments added.
        """
        added = super().add_method_arguments(class_type, method_name, *args, **kwargs)
        group = (self.groups or {}).get(method_name)
        if group is not None and isinstance(class_type, type) and issubclass(class_type, Trainer):
            group.title = f"Trainer.{method_name}'s own options"
        return added


class HelpModel(argparse.Action):
    """``--help-model [CLASS]``: print the options of the model class CLASS (a class path or, for lit-dof's phases,
    its name) and exit; without CLASS, those of the model configured so far on the command line (``--config``,
    ``--model``), else :data:`DEFAULT_MODEL`. The screen is that of ``--model.help CLASS``."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs) -> None:
        kwargs.update(nargs="?", default=argparse.SUPPRESS, metavar="CLASS")
        kwargs.setdefault(
            "help",
            "Show the options of the model class CLASS and exit: for the student (LayerwiseDistillation, the "
            "default unless a config names another), its teacher, feature map, planner, sliding window, LoRA and "
            "learning rates. Same as --model.help CLASS.",
        )
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        """Print the screen of ``--model.help`` for the chosen class and exit."""
        model = namespace.get("model") if hasattr(namespace, "get") else None
        configured = getattr(model, "class_path", None) if model is not None else None
        target = values or configured or DEFAULT_MODEL
        model_help = parser._option_string_actions["--model.help"]
        model_help(parser, namespace, target, "--model.help")


def finish_help(parser: LightningArgumentParser) -> None:
    """Add ``--help-model`` (:class:`HelpModel`) and give the groups of :data:`GROUP_TITLES` those titles.

    Args:
        parser: a LightningCLI command's parser, its model, data, optimizer and scheduler groups added.
    """
    for key, title in GROUP_TITLES.items():
        group = (parser.groups or {}).get(key)
        if group is not None:
            group.title = title
    parser.add_argument("--help-model", action=HelpModel)
