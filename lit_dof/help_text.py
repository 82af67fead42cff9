"""Help text as a terminal shows it: docstrings without reStructuredText markup, summaries that are whole sentences.

jsonargparse builds option help, group titles and descriptions from docstrings, which lit-dof writes for Sphinx
(double backticks, ``:class:`` roles) and whose summaries often wrap onto a second line, of which jsonargparse
keeps only the first. :class:`PlainHelpFormatter` strips the markup from everything a help screen prints
(:func:`plain`); :func:`summary` gives a docstring's whole first paragraph, for a command's description;
:class:`PlainArgumentParser` is jsonargparse's parser with that formatter; :func:`command_cli` runs a function as a
``lit-dof`` command through ``auto_cli`` with both.
"""

from __future__ import annotations

import inspect
import re

from jsonargparse import ArgumentParser, DefaultHelpFormatter

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^>]+)>`_{1,2}")
_LITERAL = re.compile(r"``(.+?)``", re.S)


def _role(match: re.Match) -> str:
    target = match.group(2)
    return target.rsplit(".", 1)[-1] if match.group(1) else target


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: ``` ``x`` ``` → ``x``, ``:class:`~a.b.C``` → ``C`` (``a.b.C``
    without the ``~``), ```` `text <url>`_ ```` → ``text (url)``.

    Args:
        text: help text taken from a docstring.

    Returns:
        the text as a terminal should show it.
    """
    text = _ROLE.sub(_role, text)
    text = _LINK.sub(r"\1 (\2)", text)
    return _LITERAL.sub(r"\1", text)


def summary(obj: object) -> str:
    """The first paragraph of ``obj``'s docstring on one line, without markup (:func:`plain`).

    Args:
        obj: a documented function or class.

    Returns:
        the summary; empty without a docstring.
    """
    doc = inspect.getdoc(obj) or ""
    return plain(" ".join(doc.split("\n\n", 1)[0].split()))


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter with :func:`plain` applied to descriptions, group titles and option help."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def start_section(self, heading: str | None) -> None:
        """Start a group's section under its title without markup."""
        super().start_section(plain(heading) if heading else heading)

    def _expand_help(self, action) -> str:
        return plain(super()._expand_help(action))


class PlainArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` whose help is formatted by :class:`PlainHelpFormatter` (unless another
    ``formatter_class`` is given); the parsers it makes for ``--<key>.help`` are of this class too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)


def command_cli(function, args: list[str] | None, prog: str, **kwargs) -> object:
    """Run ``function`` as the ``lit-dof`` command ``prog``: jsonargparse's ``auto_cli`` with :func:`summary` of
    its docstring as the description and :class:`PlainArgumentParser` as the parser.

    Args:
        function: the command's function (its signature and docstring are the options and their help).
        args: the command line after the command name (``None``: ``sys.argv``).
        prog: the command as the usage line names it, e.g. ``"lit-dof eval"``.
        **kwargs: more ``auto_cli`` arguments (``as_positional``, ``fail_untyped``).

    Returns:
        what ``function`` returns.

    Raises:
        SystemExit: ``--help`` or a usage error (jsonargparse's).
    """
    from jsonargparse import auto_cli

    return auto_cli(
        function, args=args, prog=prog, description=summary(function), parser_class=PlainArgumentParser, **kwargs
    )
