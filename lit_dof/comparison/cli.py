"""``lit-dof compare``: run (or resume) the comparison grid and write its report; SIGTERM stops it as Ctrl-C does.

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
from lit_dof.comparison.report import write_report
from lit_dof.comparison.rows import REPO_CONFIGS, ROWS, control_rows, grid
from lit_dof.evaluation.retrieval_data import RETRIEVAL_TASKS, RetrievalGrid
from lit_dof.evaluation.task_data import EXTRA_TASKS, TASKS, TRAIN_SPLITS
from lit_dof.progress import Progress


# The list defaults are read by jsonargparse (shown in --help) and never mutated.
def compare(
    rows: list[str] = list(ROWS),  # noqa: B006
    budgets: list[int] = [64],  # noqa: B006
    out: str = "runs/compare",
    report_dir: str | None = None,
    stages: list[str] = ["fit", "ppl", "eval"],  # noqa: B006
    tasks: list[str] = list(TASKS),  # noqa: B006
    base_config: str | None = None,
    teacher: str | None = None,
    corpus: str | None = None,
    data_dir: str | None = None,
    eval_limit: int | None = None,
    mmlu_per_subject: int | None = 18,
    ppl_tokens: int = 16384,
    ppl_split: str = "test",
    long_documents: int | None = None,
    controls: list[str] = [],  # noqa: B006
    retrieval_tasks: list[str] = ["passkey"],  # noqa: B006
    retrieval: RetrievalGrid = RetrievalGrid(),  # noqa: B008
    fit_args: list[str] = [],  # noqa: B006
    finetune_tasks: list[str] = list(TRAIN_SPLITS),  # noqa: B006
    finetune_lrs: list[float] = [1e-5, 3e-5, 1e-4],  # noqa: B006
    finetune_args: list[str] = [],  # noqa: B006
    device: str = "auto",
    eval_batch_size: int = 16,
    seeds: list[int] = [0],  # noqa: B006
    carry: bool = True,
) -> dict:
    """Run (or resume) the comparison and write its report. Progress goes to stderr: the cell under way (k of n),
    the time elapsed and an estimate of the time left.

    Args:
        rows: method rows (default: all of them, lit_dof.comparison.rows.ROWS, teacher first).
        budgets: per-layer mean feature dims C (the total budget is L · C).
        out: where the cell directories go.
        report_dir: where comparison.{json,md,png} go (default: ``out``).
        stages: which of ``fit``, ``ppl``, ``long``, ``long_documents``, ``retrieval``, ``eval``, ``finetune`` to run
            now (the report is always rewritten; ``long`` — perplexity by position up to 8192 tokens of context —,
            ``long_documents`` — the long-document test set by in-document position —, ``retrieval`` — the
            retrieval tasks by greedy generation over contexts × needle depths — and ``finetune`` — the paper's
            protocol — are opt-in: they are the costliest stages on a CPU).
        tasks: which tasks the ``eval`` stage runs now: the seven zero-shot tasks and ``mmlu_5shot`` (MMLU with five
            examples from its dev split, prompts past a 64-token window). The report always shows the seven
            (missing cells are –; the average is theirs) and an extra task wherever a cell has it.
        base_config: shared recipe (default configs/quickstart.yaml).
        teacher: replaces the base config's teacher (alias, directory, ``.gguf`` file or hub id).
        corpus: corpus file (default ``$LIT_DOF_CORPUS``).
        data_dir: task data (default ``$LIT_DOF_DATA``).
        eval_limit: examples per task.
        mmlu_per_subject: MMLU subset: the first this-many questions per subject (18 → 1026 questions).
        ppl_tokens: held-out tokens for the perplexity column.
        ppl_split: the documents the ``ppl`` and ``long`` stages score: ``test`` (default; lit_dof.data.splits) or
            ``validation`` (model selection; the records measured before the test split, kept reproducible).
        long_documents: documents of the ``long_documents`` stage (the first ones; default: all of them).
        controls: student rows shown beside their controls, each measured by every stage as a row of its own
            (``<row>:window_sinks``, the teacher behind the student's window + sinks; ``<row>:equal_state``, the
            teacher behind the window of equal decode state; ``<row>:tail_only``, the student's LoRA-merged weights
            with full attention; lit_dof.evaluation.controls). The teacher-weight controls are measured once per
            window and shared by every seed.
        retrieval_tasks: the tasks of the ``retrieval`` stage (lit_dof.evaluation.retrieval_data.RETRIEVAL_TASKS).
        retrieval: where their examples sit: ``contexts`` (tokens), ``depths`` (0–1), ``trials`` per cell, ``seed``.
        fit_args: extra ``lit-dof fit`` arguments for every student (planner settings,
            ``--model.init_args.planner.init_args.<key>``, only where every row's planner takes them: the
            window-only controls' FixedPlanner takes no DoF settings).
        finetune_tasks: tasks of the protocol (those with training data offline).
        finetune_lrs: the learning-rate grid searched on the teacher, reused for the students.
        finetune_args: extra arguments of every fine-tuning fit (e.g. ``--data.init_args.train_limit=200``).
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``, for every stage (see
            lit_dof.comparison.cells.Comparison).
        eval_batch_size: loglikelihood requests per forward in the ``eval`` stage (results depend on it only
            through float rounding).
        seeds: training seeds of every student row (0: the base config's seeds). With two or more the report
            adds the spread over seeds.
        carry: keep the cells of ``report_dir``'s earlier ``comparison.json`` that have no run directory under
            ``out`` (a lost or cleaned scratch folder; each is marked in the table); ``false``: only ``out``.

    Raises:
        ValueError: an unknown row, stage, retrieval task or device; seeds that are repeated or negative; a
            ``controls`` row that is not a selected student row.
    """
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; known: {', '.join(ROWS)}")
    unknown_tasks = sorted(set(tasks) - {*TASKS, *EXTRA_TASKS})
    if unknown_tasks:
        raise ValueError(f"unknown task(s) {unknown_tasks}; known: {', '.join((*TASKS, *EXTRA_TASKS))}")
    bad = sorted(set(stages) - set(STAGES))
    if bad:
        raise ValueError(f"unknown stage(s) {bad}; use {', '.join(STAGES)}")
    unknown_retrieval = sorted(set(retrieval_tasks) - set(RETRIEVAL_TASKS))
    if unknown_retrieval:
        raise ValueError(f"unknown retrieval task(s) {unknown_retrieval}; known: {', '.join(RETRIEVAL_TASKS)}")
    no_controls = [r for r in controls if r not in rows or ROWS[r].kind != "student"]
    if no_controls:
        raise ValueError(f"--controls {no_controls}: name student rows that --rows selects (e.g. quickstart)")
    if ppl_split not in ("test", "validation"):
        raise ValueError(f"ppl_split {ppl_split!r}: use test (the default) or validation")
    if not seeds or len(set(seeds)) != len(seeds) or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds {seeds}: give distinct integers ≥ 0 (e.g. [0, 1, 2])")
    comparison = Comparison(
        out=Path(out),
        base_config=Path(base_config) if base_config else REPO_CONFIGS / "quickstart.yaml",
        teacher=teacher,
        corpus=corpus or os.environ.get("LIT_DOF_CORPUS"),
        data_dir=data_dir or os.environ.get("LIT_DOF_DATA"),
        eval_limit=eval_limit,
        mmlu_per_subject=mmlu_per_subject,
        ppl_tokens=ppl_tokens,
        ppl_split=ppl_split,
        long_documents=long_documents,
        retrieval_tasks=tuple(retrieval_tasks),
        retrieval=retrieval,
        fit_args=tuple(fit_args),
        finetune_lrs=tuple(finetune_lrs),
        finetune_args=tuple(finetune_args),
        device=device,
        batch_size=eval_batch_size,
    )
    selected = [r for name in rows for r in [ROWS[name], *(control_rows(ROWS[name]) if name in controls else [])]]
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
    return write_report(comparison, selected, budgets, Path(report_dir or out), seeds=seeds, carry=carry)


STAGES = ("fit", "ppl", "long", "long_documents", "retrieval", "eval", "finetune")
"""The stages of ``lit-dof compare``, in the order a cell runs them."""


def _ready(comparison: Comparison, row, budget: int) -> bool:
    """Whether a cell can be measured: the teacher always, a student once fitted, a control once its student is
    fitted and has that control (its ``control.json`` is written here, from the student, the first time)."""
    if row.kind == "teacher":
        return True
    student = ROWS[row.of] if row.kind == "control" else row
    if not (comparison.cell_dir(student, budget) / "fit.json").is_file():
        return False
    return row.kind != "control" or describe_controls(comparison, student, budget)[row.control]["control"] is not None


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
        command_cli(compare, args, "lit-dof compare", as_positional=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
