"""``lit-dof compare``: run (or resume) the comparison grid and write its report; SIGTERM stops it as Ctrl-C does.
The options of where and how the cells run are the fields of :class:`~lit_dof.comparison.cells.Comparison`,
declared there once; the grid's (rows, budgets, seeds, stages, …) are :func:`compare`'s.

Example::

    lit-dof compare --rows '[teacher, performer, fix, dof]' --budgets '[64]' --out runs/compare
    lit-dof compare --rows '[teacher, quickstart]' --controls '[quickstart]' --seeds '[0, 1, 2]' \
        --stages '[fit, ppl, long_documents, retrieval, eval]' --long_documents 20   # a student beside its controls
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from lit_dof.comparison.cells import Comparison
from lit_dof.comparison.control_cells import describe_controls
from lit_dof.comparison.records import Report
from lit_dof.comparison.report import write_report
from lit_dof.comparison.rows import CONTROLS, check_control_kinds, control_rows, grid
from lit_dof.evaluation.finetune_splits import PROTOCOL_TASKS
from lit_dof.evaluation.task_data import EXTRA_TASKS, TASKS
from lit_dof.progress import Progress


# The list defaults are read by jsonargparse (shown in --help) and never mutated.
def compare(
    comparison: Comparison,
    rows: list[str] | None = None,
    budgets: list[int] = [64],  # noqa: B006
    report_dir: str | None = None,
    stages: list[str] = ["fit", "ppl", "eval"],  # noqa: B006
    tasks: list[str] = list(TASKS),  # noqa: B006
    controls: list[str] = [],  # noqa: B006
    control_kinds: list[str] = list(CONTROLS),  # noqa: B006
    finetune_tasks: list[str] = list(PROTOCOL_TASKS),  # noqa: B006
    seeds: list[int] = [0],  # noqa: B006
    carry: bool = True,
) -> Report:
    """Run (or resume) the comparison and write its report. Progress goes to stderr: the cell under way (k of n),
    the time elapsed and an estimate of the time left.

    Args:
        comparison: where and how the cells run (on the command line, its fields are options of their own:
            ``--out``, ``--teacher``, ``--corpus``, …; an unset ``corpus``/``data_dir`` is ``$LIT_DOF_CORPUS``/
            ``$LIT_DOF_DATA``). Its ``seed`` is ignored: ``seeds`` gives the cells' seeds.
        rows: method rows, names of ``--rows_file`` (default: all of its rows, in its order).
        budgets: per-layer mean feature dims C (the total budget is L · C).
        report_dir: where comparison.{json,md,png} go (default: ``out``).
        stages: which of ``fit``, ``ppl``, ``long``, ``long_documents``, ``retrieval``, ``eval``, ``finetune`` to run
            now (the report is always rewritten; ``long`` — perplexity by position up to 8192 tokens of context —,
            ``long_documents`` — the long-document test set by in-document position —, ``retrieval`` — the
            retrieval tasks by greedy generation over contexts × needle depths — and ``finetune`` — the paper's
            protocol — are opt-in: they are the costliest stages on a CPU).
        tasks: which tasks the ``eval`` stage runs now: the seven zero-shot tasks and ``mmlu_5shot`` (MMLU with five
            examples from its dev split, prompts past a 64-token window). The report always shows the seven
            (missing cells are –; the average is theirs) and an extra task wherever a cell has it.
        controls: student rows shown beside their controls, each measured by every stage as a row of its own
            (``<row>:window_sinks``, the teacher behind the student's window + sinks; ``<row>:equal_state``, the
            teacher behind the window of equal decode state; ``<row>:tail_only``, the student's LoRA-merged weights
            with full attention; ``<row>:far_only``, the student with its window cut to the token itself and no
            sinks; lit_dof.evaluation.controls). The teacher-weight controls are measured once per
            window and shared by every seed.
        control_kinds: which of the four controls each row of ``--controls`` is shown beside: ``window_sinks``,
            ``equal_state``, ``tail_only``, ``far_only`` (default all four; a study that reads only (a) and (b) saves
            the other two's stages).
        finetune_tasks: tasks of the protocol (those with training data offline).
        seeds: training seeds of every student row (0: the base config's seeds). With two or more the report
            adds the spread over seeds.
        carry: keep the cells of ``report_dir``'s earlier ``comparison.json`` that have no run directory under
            ``out`` (a lost or cleaned scratch folder; each is marked in the table); ``false``: only ``out``.

    Returns:
        the report, as written to ``comparison.json``.

    Raises:
        ValueError: an unknown row, stage, task or control kind; seeds that are repeated or negative; a ``controls``
            row that is not a selected student row.
    """
    known = comparison.known_rows
    rows = list(known) if rows is None else rows
    unknown = sorted(set(rows) - set(known))
    if unknown:
        raise ValueError(f"unknown row(s) {unknown} in {comparison.rows_file.name}; known: {', '.join(known)}")
    unknown_tasks = sorted(set(tasks) - {*TASKS, *EXTRA_TASKS})
    if unknown_tasks:
        raise ValueError(f"unknown task(s) {unknown_tasks}; known: {', '.join((*TASKS, *EXTRA_TASKS))}")
    bad = sorted(set(stages) - set(STAGES))
    if bad:
        raise ValueError(f"unknown stage(s) {bad}; use {', '.join(STAGES)}")
    no_controls = [r for r in controls if r not in rows or known[r].kind != "student"]
    if no_controls:
        raise ValueError(f"--controls {no_controls}: name student rows that --rows selects (e.g. quickstart)")
    check_control_kinds(control_kinds)
    if not seeds or len(set(seeds)) != len(seeds) or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds {seeds}: give distinct integers ≥ 0 (e.g. [0, 1, 2])")
    comparison = replace(
        comparison,
        corpus=comparison.corpus or os.environ.get("LIT_DOF_CORPUS"),
        data_dir=comparison.data_dir or os.environ.get("LIT_DOF_DATA"),
    )
    selected = []
    for name in rows:
        selected += [known[name], *(control_rows(known[name], control_kinds) if name in controls else [])]
    cells = list(grid(selected, budgets, seeds))
    progress = Progress("compare", len(cells), "cell")  # stderr: cells done / total, elapsed, ETA
    for budget, seed, row in cells:
        seeded = replace(comparison, seed=seed)
        seed_note = f" seed {seed}" if seed and row.kind != "teacher" else ""
        progress.begin(f"C={budget} {row.name}{seed_note} ({', '.join(stages)})")
        if row.kind == "student" and "fit" in stages:
            seeded.fit(row, budget)
        ready = _ready(seeded, row, budget)
        if ready and "ppl" in stages:
            seeded.perplexity(row, budget)
        if ready and "long" in stages:
            seeded.long_context(row, budget)
        if ready and "long_documents" in stages:
            seeded.long_document_perplexity(row, budget)
        if ready and "retrieval" in stages:
            seeded.retrieval_stage(row, budget)
        if ready and "eval" in stages:
            seeded.evaluate(row, budget, tasks)
        if ready and "finetune" in stages and row.kind != "control":
            for task in finetune_tasks:
                seeded.finetune(row, budget, task)
    if cells:
        progress.end("every cell; writing the report")
    return write_report(comparison, selected, budgets, Path(report_dir or comparison.out), seeds=seeds, carry=carry)


SKIPPED = ("seed", "ppl_window", "ppl_stride", "long_contexts")
"""The fields of :class:`~lit_dof.comparison.cells.Comparison` that are no options of ``lit-dof compare`` (``--seeds``
gives the cells' seeds; the perplexity's window, stride and long contexts are the records' own)."""

STAGES = ("fit", "ppl", "long", "long_documents", "retrieval", "eval", "finetune")
"""The stages of ``lit-dof compare``, in the order a cell runs them."""


def _ready(comparison: Comparison, row, budget: int) -> bool:
    """Whether a cell can be measured: the teacher always, a student once fitted, a control once its student is
    fitted and has that control (its ``control.json`` is written here, from the student, the first time)."""
    if row.kind == "teacher":
        return True
    student = comparison.known_rows[row.of] if row.kind == "control" else row
    if not (comparison.cell_dir(student, budget) / "fit.json").is_file():
        return False
    return row.kind != "control" or describe_controls(comparison, student, budget)[row.control].control is not None


def main(args: list[str] | None = None) -> None:
    """Entry of ``lit-dof compare``.

    Args:
        args: the command line after ``compare`` (``None``: jsonargparse reads ``sys.argv[1:]``).
    """
    import signal

    from lit_dof.help_text import command_cli

    def stop(signum, frame):  # SIGTERM (a batch scheduler, `kill`) ends the run as Ctrl-C does: the fit under way
        raise KeyboardInterrupt(f"signal {signum}")  # is stopped, its attempt recorded, and it resumes from last.ckpt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        command_cli(compare, args, "lit-dof compare", flat=["comparison"], skip=SKIPPED, as_positional=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
