"""Help text as a terminal shows it: docstrings without reStructuredText markup, summaries that are whole sentences.

jsonargparse builds option help, group titles and descriptions from docstrings, which lit-dof writes for Sphinx
(double backticks, ``:class:`` roles) and whose summaries often wrap onto a second line, of which jsonargparse
keeps only the first. :class:`PlainHelpFormatter` strips the markup from everything a help screen prints
(:func:`plain`); :func:`summary` gives a docstring's whole first paragraph, for a command's description;
:class:`PlainArgumentParser` is jsonargparse's parser with that formatter; :func:`command_cli` runs a function as a
``lit-dof`` command through ``auto_cli`` with both, or through :func:`command_parser` where a dataclass parameter's
fields are options of their own (``--max_new_tokens``, not ``--settings.max_new_tokens``); :func:`command_line`
lets options be spelt with ``-`` or ``_`` and boolean flags stand alone.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Sequence

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


def command_cli(
    function,
    args: list[str] | None,
    prog: str,
    flat: Sequence[str] = (),
    skip: Sequence[str] = (),
    epilog: str | None = None,
    **kwargs,
) -> object:
    """Run ``function`` as the ``lit-dof`` command ``prog``: jsonargparse's ``auto_cli`` with :func:`summary` of
    its docstring as the description and :class:`PlainArgumentParser` as the parser; with ``flat``, ``skip`` or
    ``epilog``, the parser of :func:`command_parser` and ``function`` called with what it parses.

    Args:
        function: the command's function (its signature and docstring are the options and their help).
        args: the command line after the command name (``None``: ``sys.argv``).
        prog: the command as the usage line names it, e.g. ``"lit-dof eval"``.
        flat: parameters of ``function`` typed by a dataclass whose fields are top-level options
            (:func:`command_parser`); ``function`` gets the dataclass built from them.
        skip: parameters of ``function`` and fields of the ``flat`` dataclasses that are no options (their
            defaults apply).
        epilog: text after the options on the help screen.
        **kwargs: more ``auto_cli`` arguments (``as_positional``, ``fail_untyped``).

    Returns:
        what ``function`` returns.

    Raises:
        SystemExit: ``--help`` or a usage error (jsonargparse's).
    """
    from jsonargparse import auto_cli

    if not (flat or skip or epilog):
        return auto_cli(
            function, args=args, prog=prog, description=summary(function), parser_class=PlainArgumentParser, **kwargs
        )
    parser = command_parser(function, prog, flat, skip, epilog, **kwargs)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # named so since 4.49
    parsed = vars(instantiate(parser.parse_args(args)))
    values = {k: v for k, v in parsed.items() if k in inspect.signature(function).parameters}
    hints = typing.get_type_hints(function)
    for name in flat:
        names = {f.name for f in dataclasses.fields(hints[name]) if f.init}
        values[name] = hints[name](**{k: v for k, v in parsed.items() if k in names})
    return function(**values)


def command_parser(
    function,
    prog: str,
    flat: Sequence[str] = (),
    skip: Sequence[str] = (),
    epilog: str | None = None,
    as_positional: bool = True,
    fail_untyped: bool = True,
) -> PlainArgumentParser:
    """The parser of the ``lit-dof`` command ``prog`` over ``function``: ``--config`` and ``--print_config``, its
    parameters as options, and the fields of each dataclass parameter named in ``flat`` as top-level options (in a
    group titled by the dataclass's docstring, with the help of its ``Args:``), their defaults those of the
    parameter's default instance where it has one (``settings: GenerationSettings = CHAT_SETTINGS``).

    Args:
        function: the command's function.
        prog: the command as the usage line names it.
        flat: parameters of ``function`` typed by a dataclass, one declaration of options several commands share
            (or of the settings a command passes on whole).
        skip: parameters of ``function`` and fields of the ``flat`` dataclasses that are no options.
        epilog: text after the options on the help screen.
        as_positional: required parameters are positional arguments.
        fail_untyped: refuse parameters without a type.

    Returns:
        the parser.

    Raises:
        ValueError: an option declared twice (a ``flat`` field named as another option).
    """
    from jsonargparse import ActionConfigFile

    parser = PlainArgumentParser(prog=prog, description=summary(function), epilog=epilog)
    parser.add_argument("--config", action=ActionConfigFile, help="Path to a configuration file.")
    parser.add_function_arguments(
        function, as_group=False, skip={*flat, *skip}, as_positional=as_positional, fail_untyped=fail_untyped
    )
    hints, parameters = typing.get_type_hints(function), inspect.signature(function).parameters
    for name in flat:
        parser.add_class_arguments(hints[name], nested_key=None, skip=set(skip), fail_untyped=fail_untyped)
        default = parameters[name].default
        if dataclasses.is_dataclass(default):
            fields = dataclasses.fields(default)
            parser.set_defaults({f.name: getattr(default, f.name) for f in fields if f.init and f.name not in skip})
    return parser


def command_line(args: Sequence[str], flags: Sequence[str] = ()) -> list[str]:
    """``args`` as jsonargparse parses them: option names with ``_`` for ``-`` (``--max-new-tokens`` →
    ``--max_new_tokens``, ``--top-p=0.9`` → ``--top_p=0.9``) and ``true`` after each of ``flags`` given without a
    value (``--do_sample`` for ``--do_sample true``).

    Args:
        args: a command line after the command name.
        flags: boolean options that may stand alone, spelt with ``_``.

    Returns:
        the arguments to parse.
    """
    names = [_underscored(arg) if arg.startswith("--") else arg for arg in args]
    out: list[str] = []
    for i, arg in enumerate(names):
        out.append(arg)
        following = names[i + 1] if i + 1 < len(names) else None
        if arg in flags and (following is None or following.startswith("-")):
            out.append("true")
    return out


def _underscored(option: str) -> str:
    """``--a-b=c-d`` → ``--a_b=c-d``: the name's ``-`` after the leading ``--`` as ``_``, any value kept."""
    name, equals, value = option[2:].partition("=")
    return f"--{name.replace('-', '_')}{equals}{value}"
