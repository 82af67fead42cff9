r"""``lit-dof hybrid``: the command-line face of Distill-then-Replace's search over a bank of linear twins
(:class:`~lit_dof.hybrid.run.HybridSearch`, which documents the stages), end to end and resumable. Its options
are the fields of :class:`~lit_dof.hybrid.settings.SearchSettings`, declared there once.

    lit-dof fit --config configs/base.yaml --config configs/hybrid/twins.yaml           # 1. the twin bank
    lit-dof hybrid --bank runs/hybrid/twins/version_0/student --task arc_easy \
        --data_dir $LIT_DOF_DATA --out runs/hybrid/search                               # 2. search + report
"""

from __future__ import annotations

import sys

from lit_dof.devices import device_errors_exit
from lit_dof.hybrid.record import SearchRecord
from lit_dof.hybrid.run import HybridSearch
from lit_dof.io import portable


def search(settings: HybridSearch) -> SearchRecord:
    """Search a hybrid within tolerance of the teacher, export it, compare orderings on held-out items.

    Args:
        settings: the search (on the command line, its fields are options of their own: ``--bank``, ``--task``,
            …; from Python, ``HybridSearch(...).run()`` is the same).

    Returns:
        the record, as written to ``search.json``.

    Raises:
        ValueError: an ``out`` written with other settings, a bank without twins, items that cannot be had.
        FileNotFoundError: missing bank or data.
    """
    return settings.run()


def main(args: list[str] | None = None) -> None:
    """``lit-dof hybrid``: :func:`search` from the command line (jsonargparse; ``--config`` works). The
    command line is recorded in the report, without this machine's paths.

    Args:
        args: the arguments after ``hybrid`` (default: ``sys.argv[2:]``).

    Raises:
        SystemExit: ``--help``, or a usage error (a bad option, device or dtype: message on stderr, code 2).
    """
    from lit_dof.help_text import command_cli

    args = sys.argv[2:] if args is None else list(args)
    command = ["--command", portable(["lit-dof", "hybrid", *args])]
    with device_errors_exit("lit-dof hybrid"):
        command_cli(search, [*args, *command], "lit-dof hybrid", flat=["settings"])
