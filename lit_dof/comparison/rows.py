"""The comparison's methods (:class:`Row`; the default :data:`ROWS` are data, ``configs/compare/rows.yaml``, read by
:func:`load_rows`), the controls made from a student row, the metric shown per task, and the grid of cells they make
with the budgets and seeds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import ConfigDict

from lit_dof.config_files import config_root
from lit_dof.records import parse_record

REPO_CONFIGS = config_root()
"""The folder the rows' config files are relative to."""

PLANNER_ARGS = "--model.init_args.planner.init_args"
"""The prefix of the feature-dimension planner's settings on a ``lit-dof fit`` command line."""

DEFAULT_PLANNER = "lit_dof.pipeline.planner.DoFPlanner"
"""The planner of a student module whose configs name none."""

PRIMARY_METRIC = {
    "piqa": "acc_norm",
    "logiqa": "acc_norm",
    "arc_easy": "acc_norm",
    "arc_challenge": "acc_norm",
    "winogrande": "acc",
    "wsc273": "acc",
    "mmlu": "acc",
    "mmlu_5shot": "acc",
}
"""The metric shown per task (lm-eval's usual headline: acc_norm where defined for multi-word choices)."""


@dataclass(frozen=True)
class Row:
    """One method of the comparison: config files (relative to ``configs/``) and extra CLI arguments
    composed on top of the base config. ``kind``: ``"teacher"`` (no fit), ``"student"`` or ``"control"`` (no fit:
    the control ``control`` of the student of row ``of``, :func:`control_rows`). ``reference``: the row it is
    measured against at the same budget (paired task differences, validation-perplexity ratios): Fix trained with
    the same loss, so that DoF − Fix isolates the allocation; a control's is its student."""

    __pydantic_config__: ClassVar = ConfigDict(extra="forbid")  # a typo in a rows file is an error, not a default

    name: str
    configs: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    kind: str = "student"
    note: str = ""
    reference: str = "fix"
    control: str | None = None
    of: str | None = None


ROWS_FILE = REPO_CONFIGS / "compare" / "rows.yaml"
"""The default rows: ``configs/compare/rows.yaml``."""


@dataclass
class RowsFile:
    """A rows file: its rows, in table order, and the row whose seven-task average is the floor of the report's "gap
    closed" column (the paper's: the untrained Performer; ``None``: no such column). Other top-level keys, such as
    YAML anchors, are ignored."""

    rows: list[Row]
    gap_floor: str | None = None


def load_rows(path: str | Path = ROWS_FILE) -> dict[str, Row]:
    """The rows of a rows file (``lit-dof compare --rows_file``), by name, in the file's order
    (:func:`load_rows_file`).

    Args:
        path: the file.

    Returns:
        ``{name: row}``.
    """
    return {r.name: r for r in load_rows_file(path).rows}


def load_rows_file(path: str | Path = ROWS_FILE) -> RowsFile:
    """A rows file, validated.

    Args:
        path: a YAML file with a ``rows:`` list of :class:`Row` fields and an optional ``gap_floor:`` row name
            (``configs/compare/rows.yaml`` says how).

    Returns:
        The file's rows and gap floor.

    Raises:
        FileNotFoundError: no such file, or a row naming a config file that is not under ``configs/``.
        ValueError: a row with an unknown field or one of the wrong type (pydantic names it), a name twice or with a
            ``:`` (control rows are ``<student>:<control>``), a kind other than ``teacher``/``student``, or a
            reference or gap floor that is not a row of the file.
    """
    import yaml

    found = parse_record(RowsFile, yaml.safe_load(Path(path).read_text()) or {})
    rows = found.rows
    names = [r.name for r in rows]
    problems = [f"{n!r} twice" for n in dict.fromkeys(n for n in names if names.count(n) > 1)]
    problems += [f"{r.name!r}: names hold no ':'" for r in rows if ":" in r.name]
    problems += [f"{r.name!r}: kind {r.kind!r} (use student or teacher)" for r in rows if r.kind not in KINDS]
    problems += [
        f"{r.name!r}: reference {r.reference!r} is not a row"
        for r in rows
        if r.kind == "student" and r.reference not in names
    ]
    if found.gap_floor is not None and found.gap_floor not in names:
        problems.append(f"gap_floor {found.gap_floor!r} is not a row")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    missing = [f"{r.name}: {c}" for r in rows for c in r.configs if not (REPO_CONFIGS / c).is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: config files not under {REPO_CONFIGS}: {', '.join(missing)}")
    return found


KINDS = ("teacher", "student")
"""The kinds of row a rows file holds (control rows are made from student rows, :func:`control_rows`)."""

ROWS: dict[str, Row] = load_rows()
"""The default rows (:data:`ROWS_FILE`; ``--rows`` picks a subset, in any order)."""


CONTROLS = {
    "window_sinks": "control (a): the teacher behind the student's own window + sinks, no far term",
    "equal_state": "control (b): the teacher behind the window whose KV cache holds the student's decode state, "
    "+ its sinks",
    "tail_only": "control (c): the student's LoRA-merged weights with full softmax attention, no linear part",
    "far_only": "control (d): the student with its window cut to the token itself and no sinks — its far term alone",
}
"""The controls every student is shown beside (:func:`lit_dof.evaluation.controls.control_models`), by name."""


def check_control_kinds(kinds: Sequence[str]) -> None:
    """Refuse an empty list of control kinds or one not in :data:`CONTROLS` (``--control_kinds``).

    Raises:
        ValueError: naming the unknown kinds and the known ones.
    """
    unknown = sorted(set(kinds) - set(CONTROLS))
    if unknown or not kinds:
        raise ValueError(
            f"--control_kinds {list(kinds)}: unknown control kind(s) {unknown or 'none given'}; "
            f"give one or more of {', '.join(CONTROLS)}"
        )


def control_rows(row: Row, kinds: Sequence[str] | None = None) -> list[Row]:
    """The control rows of a student row: ``<row>:window_sinks`` (a), ``<row>:equal_state`` (b),
    ``<row>:tail_only`` (c) and ``<row>:far_only`` (d), each measured against the student (``reference``). Whether
    the student has a control (a pure linear one has no (a) and no (d), one without a tail no (c)) is known only once
    it is fitted.

    Args:
        row: a student row.
        kinds: which of :data:`CONTROLS`, in that order whatever the order given (``None``: all four).

    Returns:
        The rows, (a) to (d) or the ``kinds`` among them.

    Raises:
        ValueError: ``row`` is not a student row, or ``kinds`` as :func:`check_control_kinds` refuses them.
    """
    if row.kind != "student":
        raise ValueError(f"{row.name} is a {row.kind} row: only students have controls")
    if kinds is not None:
        check_control_kinds(kinds)
    return [
        Row(f"{row.name}:{name}", kind="control", note=note, reference=row.name, control=name, of=row.name)
        for name, note in CONTROLS.items()
        if kinds is None or name in kinds
    ]


def grid(rows: Sequence[Row], budgets: Sequence[int], seeds: Sequence[int]) -> Iterator[tuple[int, int, Row]]:
    """The cells to run or report, in table order; the teacher once (first budget and seed): it has neither.

    Args:
        rows: the selected rows.
        budgets: feature budgets C.
        seeds: training seeds.

    Yields:
        ``(budget, seed, row)`` per cell.
    """
    for budget in budgets:
        for seed in seeds:
            for row in rows:
                if row.kind != "teacher" or (budget == budgets[0] and seed == seeds[0]):
                    yield budget, seed, row


def planner_class(configs: Sequence[str | Path], args: Sequence[str] = ()) -> str:
    """The feature-dimension planner that ``lit-dof fit`` builds from these config files and arguments: the last
    ``model.init_args.planner`` class set (a class path, or a mapping with ``class_path``; jsonargparse's composition
    keeps a class until another is named), else :data:`DEFAULT_PLANNER`.

    Args:
        configs: the ``--config`` files, in order.
        args: the other arguments, in order (``--model.init_args.planner=<class>`` or ``….planner.class_path=…``).

    Returns:
        The class path, as written (jsonargparse also takes a class's bare name).
    """
    import yaml

    from lit_dof.pipeline.fit_config import FitConfig, named_planner

    found = DEFAULT_PLANNER
    for path in [p for p in map(Path, configs) if p.is_file()]:  # a missing file: the fit itself reports it
        found = FitConfig.load(path).planner_class or found
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("--model.init_args.planner", "--model.init_args.planner.class_path"):
            found = named_planner(yaml.safe_load(value)) or found
    return found
