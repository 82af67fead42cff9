"""The ``lit-dof`` command table: names and one-line descriptions of every subcommand, shared by the top-level
parser (:mod:`lit_dof.cli`) and the LightningCLI commands (:mod:`lit_dof.pipeline.cli`) so that neither imports
the other. Imports nothing."""

PROG = "lit-dof"

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
"""The subcommands LightningCLI parses and runs."""

COMMANDS: dict[str, str] = {
    "fit": "Train a student: DoF, dims, distillation, export (LightningCLI).",
    "validate": "Held-out perplexity of student and teacher (LightningCLI).",
    "test": "LightningCLI's test loop (no lit-dof phase defines one).",
    "predict": "Teacher capture: q/k samples and DoF report (LightningCLI).",
    "eval": "Zero-shot task accuracy of a teacher or a student (lm-eval).",
    "lm-eval": "lm-eval's own CLI, with the model `lit_dof` (students, teachers) registered.",
    "compare": "Train and evaluate every method alike; resumable; a report.",
    "hybrid": "Choose which blocks to linearise; export and compare hybrids.",
    "plan": "GPU memory and host RAM per rank of a fit command line.",
    "generate": "Generate text from a teacher, student or hybrid: tokens/s, cache bytes.",
    "chat": "Chat with a student over several turns: tokens/s, state bytes per turn.",
    "configs": "List, show or copy the shipped YAML configs.",
}
"""Every ``lit-dof`` subcommand and its one-line description (the top-level ``--help``)."""
