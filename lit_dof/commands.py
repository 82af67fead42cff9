"""The ``lit-dof`` command table: every subcommand's name, one-line description and entry point, in one place.

Shared by the top-level parser and dispatcher (:mod:`lit_dof.cli`) and the LightningCLI commands
(:mod:`lit_dof.pipeline.cli`), so that neither imports the other. Entry points are ``"module:function"`` strings,
imported only when their command runs: this module imports nothing. A new command is one :class:`Command` here.
"""

from typing import NamedTuple

PROG = "lit-dof"

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
"""The subcommands LightningCLI parses and runs."""


class Command(NamedTuple):
    """One ``lit-dof`` subcommand.

    Attributes:
        description: the one-line description of the top-level ``--help`` (a whole sentence).
        entry: ``"module:function"`` called with the arguments after the command name, or ``None`` for the
            LightningCLI commands (:data:`LIGHTNING_COMMANDS`), which parse the whole command line.
        needs_lm_eval: the entry's module imports lm-eval: check that the ``eval`` extra is installed first, so a
            missing extra is one line naming it, not an ``ImportError`` traceback.
    """

    description: str
    entry: str | None = None
    needs_lm_eval: bool = False


TABLE: dict[str, Command] = {
    "fit": Command("Train a student: DoF, dims, distillation, export (LightningCLI)."),
    "validate": Command("Held-out perplexity of student and teacher (LightningCLI)."),
    "test": Command("LightningCLI's test loop (no lit-dof phase defines one)."),
    "predict": Command("Teacher capture: q/k samples and DoF report (LightningCLI)."),
    "eval": Command("Zero-shot task accuracy of a teacher or a student (lm-eval).", "lit_dof.evaluation.cli:main"),
    "lm-eval": Command(
        "lm-eval's own CLI, with the model `lit_dof` (students, teachers) registered.",
        "lit_dof.evaluation.lm_eval_model:main",
        needs_lm_eval=True,
    ),
    "compare": Command("Train and evaluate every method alike; resumable; a report.", "lit_dof.comparison.cli:main"),
    "hybrid": Command("Choose which blocks to linearise; export and compare hybrids.", "lit_dof.hybrid.cli:main"),
    "plan": Command("GPU memory and host RAM per rank of a fit command line.", "lit_dof.pipeline.cli:plan_main"),
    "generate": Command(
        "Generate text from a teacher, student or hybrid: tokens/s, cache bytes.", "lit_dof.generation:main"
    ),
    "chat": Command("Chat with a student over several turns: tokens/s, state bytes per turn.", "lit_dof.chat:main"),
    "configs": Command("List, show or copy the shipped YAML configs.", "lit_dof.cli:configs_main"),
}
"""Every ``lit-dof`` subcommand by name."""

COMMANDS: dict[str, str] = {name: command.description for name, command in TABLE.items()}
"""Every ``lit-dof`` subcommand and its one-line description (the top-level ``--help``)."""
