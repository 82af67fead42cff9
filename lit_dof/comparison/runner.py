"""The comparison's subprocesses (fits, fine-tuning runs): one command run in a folder, its output appended to a
log there, its exit code checked."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path


class CommandFailed(RuntimeError):
    """A command run by :func:`run_logged` exited with a non-zero code.

    Attributes:
        returncode: the command's exit code.
    """

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode


def run_logged(command: Sequence[str], cwd: Path, what: str, log_name: str = "fit.log") -> None:
    """Run ``command`` with ``cwd`` as working directory, appending a ``$ (cd <cwd> && <command>)`` line and then
    the command's stdout and stderr to ``cwd / log_name``.

    Args:
        command: the command's words.
        cwd: the working directory; it holds the log.
        what: the run's name in the error message (``"fit of dof (C=64)"``).
        log_name: the log file's name in ``cwd``.

    Raises:
        CommandFailed: the command exited with a non-zero code (``"<what> failed with code <code>; see <log>"``).
    """
    log_path = Path(cwd) / log_name
    with open(log_path, "a") as log:
        log.write(f"\n$ (cd {cwd} && {' '.join(command)})\n")
        log.flush()
        code = subprocess.run(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise CommandFailed(f"{what} failed with code {code}; see {log_path}", code)
