"""Errors whose message is the whole story: the ``lit-dof`` command reports them in one line, without a traceback.

Library code raises a subclass of :class:`CommandError` that also derives from the built-in error its callers
already catch (``RuntimeError``, ``FileNotFoundError``, …), so nothing changes for code that calls the library;
:func:`lit_dof.cli.main` prints ``lit-dof COMMAND: error: MESSAGE`` on stderr and exits with code 1, and shows the
traceback as well when the command line holds ``--verbose``.
"""

from __future__ import annotations


class CommandError(Exception):
    """An error whose message says what is wrong and how to fix it, so a traceback would add nothing for a user."""
