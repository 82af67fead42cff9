"""The comparison's one subprocess helper: the command and its output land in the log; a non-zero exit raises."""

from __future__ import annotations

import sys

import pytest

from lit_dof.comparison.runner import CommandFailed, run_logged


def test_run_logged_appends_the_command_and_its_output_and_checks_the_exit_code(tmp_path):
    run_logged([sys.executable, "-c", "print('first')"], tmp_path, "probe")
    with pytest.raises(CommandFailed, match=f"probe failed with code 3; see {tmp_path / 'fit.log'}") as failure:
        run_logged([sys.executable, "-c", "import sys; print('second'); sys.exit(3)"], tmp_path, "probe")
    assert failure.value.returncode == 3 and isinstance(failure.value, RuntimeError)
    log = (tmp_path / "fit.log").read_text()
    assert log.count(f"$ (cd {tmp_path} && {sys.executable} -c") == 2
    assert log.index("first") < log.index("second")  # appended, not overwritten
