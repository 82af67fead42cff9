"""The ``lit-dof`` command: one entry point for every subcommand.

    lit-dof --help                                   every command, one line each
    lit-dof --version
    lit-dof fit --config configs/quickstart.yaml     (LightningCLI: fit, validate, test, predict)
    lit-dof eval --help                              a command's own options

``fit``, ``validate``, ``test`` and ``predict`` are :class:`~lit_dof.pipeline.cli.LitDofCLI` (a LightningCLI: repeated
``--config``, ``--print_config``, top-level options before the subcommand as in ``lit-dof --config run.yaml fit``);
``eval``, ``compare``, ``hybrid``, ``generate``, ``chat`` and ``plan`` are commands of their modules; ``lm-eval`` is
lm-eval's own CLI (:mod:`lit_dof.evaluation.lm_eval_model`); ``configs`` lists, prints and copies the shipped configs
(:mod:`lit_dof.config_files`). This module imports none of them until one is run, so ``--help``, ``--version`` and
``configs`` answer at once. ``python -m lit_dof`` is the same command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from lit_dof.commands import COMMANDS, LIGHTNING_COMMANDS, PROG, TABLE  # noqa: F401  (re-exported)

VERBOSE = "--verbose"
"""The option, accepted by every command but ``lm-eval``, that adds the traceback to a one-line error."""


def version() -> str:
    """The installed lit-dof version (:func:`importlib.metadata.version`), else the package's ``__version__``.

    Returns:
        the version string, e.g. ``0.1.0``.
    """
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("lit-dof")
    except PackageNotFoundError:  # a source checkout on sys.path, not installed
        from lit_dof import __version__

        return __version__


def top_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``--help`` lists :data:`COMMANDS`, ``--version`` prints :func:`version`.

    It parses the command's name only; each command parses its own arguments.

    Returns:
        the parser.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Distil softmax attention into linear attention with per-layer feature dimensions from the "
        "degrees of freedom of the attention kernel.",
        epilog=f"`{PROG} COMMAND --help` shows a command's options; `{PROG} fit --help-model` the student's own "
        "(teacher, feature map, planner, sliding window, LoRA, learning rates). fit, validate, test and predict "
        f"compose YAML files with repeated --config; `{PROG} configs list` shows the shipped ones. An error that "
        f"{PROG} reports in one line shows its traceback too with {VERBOSE}.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)
    for name, description in COMMANDS.items():
        commands.add_parser(name, help=description, add_help=False)
    return parser


def configs_main(args: Sequence[str]) -> None:
    """``lit-dof configs``: ``list`` (names and first comment lines), ``show NAME``, ``copy NAME [DEST]``.

    Args:
        args: the arguments after ``configs``.

    Raises:
        SystemExit: ``--help``, or an error (unknown name, existing destination; message on stderr, code 2).
    """
    from lit_dof import config_files

    parser = argparse.ArgumentParser(
        prog=f"{PROG} configs",
        description=COMMANDS["configs"],
        epilog="NAME: a path under configs/, with or without .yaml (quickstart, methods/dof, trainer/gpu.yaml).",
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION", dest="action", required=True)
    actions.add_parser(
        "list",
        help="Every shipped config: its name and the first line of its comment.",
        description="Every shipped config: its name and the first line of its comment.",
    )
    show = actions.add_parser("show", help="Print a shipped config.", description="Print a shipped config.")
    show.add_argument("name", metavar="NAME", help="the config (e.g. quickstart, methods/dof)")
    copy = actions.add_parser(
        "copy",
        help="Copy a shipped config for editing; never overwrites a file.",
        description="Copy a shipped config for editing; never overwrites a file.",
    )
    copy.add_argument("name", metavar="NAME", help="the config (e.g. quickstart, methods/dof)")
    copy.add_argument(
        "dest",
        metavar="DEST",
        nargs="?",
        default=None,
        help="the new file, or a directory to copy into (default: the current directory)",
    )
    parsed = parser.parse_args(list(args))
    sub = {"show": show, "copy": copy}.get(parsed.action, parser)
    try:
        if parsed.action == "list":
            names = config_files.shipped_configs()
            width = max(map(len, names))
            for name in names:
                print(f"{name:<{width}}  {config_files.config_description(name)}")
        elif parsed.action == "show":
            sys.stdout.write(config_files.config_path(parsed.name).read_text())
        else:
            written = config_files.copy_config(parsed.name, parsed.dest)
            print(f"copied {config_files.config_path(parsed.name).name} to {written}")
    except (FileNotFoundError, FileExistsError) as exc:
        sub.error(str(exc))


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``lit-dof`` console script.

    Runs the command named by the first argument; ``fit``/``validate``/``test``/``predict`` (and arguments
    starting with an option other than ``-h``/``--help``/``--version``) go to LightningCLI unchanged. The
    process keeps freed tensor memory instead of unmapping it (:func:`~lit_dof.runtime.tune_cpu_allocator`)
    unless ``LIT_DOF_TUNE_ALLOCATOR=0``. An error whose message says it all (:class:`~lit_dof.errors.CommandError`:
    no corpus and no network, missing task data, …) ends the command with that one line on stderr; ``--verbose``
    anywhere after the command (taken out before the command parses its arguments) adds the traceback.

    Args:
        args: the command line after ``lit-dof`` (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: ``--help``, ``--version``, a usage error, or a command's own exit; code 1 with the ``pip
            install 'lit-dof[EXTRA]'`` line on stderr when the command needs an optional dependency that is not
            installed (:mod:`lit_dof.extras`), or with the message of a :class:`~lit_dof.errors.CommandError`.
    """
    argv = sys.argv[1:] if args is None else list(args)
    command = argv[0] if argv else None
    verbose = command != "lm-eval" and VERBOSE in argv[1:]  # lm-eval's command line is lm-eval's own
    if verbose:
        argv = [arg for arg in argv if arg != VERBOSE]
        if args is None:  # LightningCLI reads sys.argv
            sys.argv = [sys.argv[0], *argv]
        else:
            args = argv
    if (
        command is None
        or command in ("-h", "--help", "--version")
        or (not command.startswith("-") and command not in COMMANDS)
    ):
        top_parser().parse_args(argv[:1])  # prints the help, the version or the error, and exits
        return

    from lit_dof.runtime import tune_cpu_allocator

    if os.environ.get("LIT_DOF_TUNE_ALLOCATOR", "1") != "0":
        tune_cpu_allocator()
    from lit_dof.errors import CommandError
    from lit_dof.extras import MissingExtraError, missing_extra

    try:
        run_command(command, argv, lightning_args=None if args is None else argv)
    except MissingExtraError as exc:  # an optional dependency is missing: say which extra, without a traceback
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    except ImportError as exc:  # a package of an extra imported where no check named the extra first
        extra = missing_extra(exc)
        if extra is None:
            raise
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: {extra}", file=sys.stderr)
        raise SystemExit(1) from exc
    except CommandError as exc:  # its message says it all: one line, the traceback only when asked for
        if verbose:
            traceback.print_exc()
        prog = f"{PROG} {command}" if command in COMMANDS else PROG
        hint = "" if verbose else f" (add {VERBOSE} for the traceback)"
        print(f"{prog}: error: {exc}{hint}", file=sys.stderr)
        raise SystemExit(1) from exc
    except BrokenPipeError:  # the reader left (`lit-dof configs list | head`): stop quietly, as the Python docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed
        raise SystemExit(1) from None


def run_command(command: str, argv: list[str], lightning_args: list[str] | None) -> None:
    """Run ``command``: its :data:`~lit_dof.commands.TABLE` entry point with the arguments after it, or
    LightningCLI (``fit``, ``validate``, ``test``, ``predict``, or LightningCLI's options first).

    Args:
        command: the first argument.
        argv: the whole command line, command included.
        lightning_args: what LightningCLI parses (``None``: ``sys.argv``).

    Raises:
        MissingExtraError: the command needs lm-eval and the ``eval`` extra is not installed, or it is ``fit`` (or
            validate / test / predict) without the ``train`` extra (its help and ``--print_config`` need none).
    """
    entry = TABLE[command].entry if command in TABLE else None
    if entry is None:
        from lit_dof.extras import TRAIN_MODULES, require_all

        options = {arg.split("=")[0] for arg in argv}
        if not {"-h", "--help", "--help-model", "--print_config"} & options and not any(
            option.endswith(".help") for option in options
        ):
            require_all(TRAIN_MODULES, f"{PROG} {command}", "train")
        from lit_dof.pipeline.cli import build_cli

        build_cli(lightning_args)
        return
    if TABLE[command].needs_lm_eval:
        from lit_dof.evaluation.extra import require_lm_eval

        require_lm_eval(f"{PROG} {command}")
    module, function = entry.split(":")
    getattr(importlib.import_module(module), function)(argv[1:])


if __name__ == "__main__":
    main()
