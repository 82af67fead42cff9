"""One cell of the comparison (method row, budget, seed): its settings, its directory and its fit (a ``lit-dof fit``
subprocess). The stages that measure the fitted model are :class:`~lit_dof.comparison.stages.EvaluationStages` and
:class:`~lit_dof.comparison.finetune_stage.FinetuneProtocol`. Each record is written once and atomically, so a re-run
skips what is finished."""

from __future__ import annotations

import glob
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lit_dof.comparison.artefacts import checkpoint_dof_report, exported_since, summarise_fit
from lit_dof.comparison.cell_records import (
    ATTEMPTS_FILE,
    FIT_FILE,
    FitAttempt,
    FitSummary,
    load_attempts,
    save_attempts,
)
from lit_dof.comparison.control_cells import records_folder
from lit_dof.comparison.finetune_stage import FinetuneProtocol
from lit_dof.comparison.rows import PLANNER_ARGS, REPO_CONFIGS, ROWS_FILE, Row, load_rows_file, planner_class
from lit_dof.comparison.runner import CommandFailed, run_logged
from lit_dof.comparison.stages import EvaluationStages
from lit_dof.evaluation.recall import TASK as RECALL
from lit_dof.evaluation.retrieval_data import RETRIEVAL_TASKS, RetrievalGrid
from lit_dof.pipeline.fit_config import FitConfig
from lit_dof.pipeline.planner import FixedPlanner
from lit_dof.records import load_record, save_record


@dataclass
class Comparison(EvaluationStages, FinetuneProtocol):
    """Where and how the comparison's cells run (see lit_dof.comparison).

    Its fields are ``lit-dof compare``'s options of the same names (but ``seed``, ``ppl_window``, ``ppl_stride``
    and ``long_contexts``), declared here once.

    Args:
        out: where the cell directories go.
        base_config: the setup every student shares, its rows composed over it (default: ``configs/base.yaml``).
        rows_file: the methods, a YAML list of rows (default: ``configs/compare/rows.yaml``, which says how to write
            one; lit_dof.comparison.rows.load_rows); read into :attr:`known_rows`.
        teacher: replaces the base config's teacher (alias, directory, ``.gguf`` file or hub id; default: the base
            config's ``model.init_args.teacher``).
        corpus: training and held-out corpus file (``lit-dof compare``: default ``$LIT_DOF_CORPUS``; the stages
            that score it fall back on it too).
        data_dir: task data folder (``lit-dof compare``: default ``$LIT_DOF_DATA``).
        eval_limit: examples per task (``None``: full sets).
        mmlu_per_subject: MMLU subset: the first this-many questions per subject (18 → 1026 questions).
        ppl_tokens: held-out tokens for the perplexity column.
        ppl_window: the perplexity's sliding window (tokens).
        ppl_stride: the perplexity window's stride (tokens).
        long_contexts: block lengths (tokens) of the ``long`` stage's perplexity by position.
        ppl_split: the documents the ``ppl`` and ``long`` stages and the ``recall`` task score: ``test`` (default;
            lit_dof.data.splits) or ``validation`` (model selection; the records measured before the test split,
            kept reproducible). A cell's record of the other split is refused, not re-measured
            (lit_dof.data.splits.check_record_split).
        long_documents: documents of the ``long_documents`` stage (the first of the long-document test set;
            ``None``: all of them).
        retrieval_tasks: the tasks of the ``retrieval`` stage (lit_dof.evaluation.retrieval_data.RETRIEVAL_TASKS),
            scored by greedy generation, and ``recall`` (lit_dof.evaluation.recall: a made-up fact in the
            ``ppl_split`` documents, teacher-forced; the same grid).
        retrieval: where their examples sit: ``contexts`` (tokens), ``depths`` (0–1), ``trials`` per cell, ``seed``.
        eval_batch_size: loglikelihood requests per forward in the ``eval`` stage (results depend on it only
            through float rounding).
        retrieval_batch_size: prompts per generation in the ``retrieval`` stage (1: each prompt alone, no padding —
            a batch pads every prompt to the longest, 8k tokens for passkey).
        fit_args: extra ``lit-dof fit`` arguments for every student (e.g. ``--trainer.max_steps=200``; planner
            settings, ``--model.init_args.planner.init_args.<key>``, only where every row's planner takes them: the
            window-only controls' FixedPlanner takes no DoF settings).
        finetune_lrs: the protocol's learning-rate grid, searched on the teacher (chosen on each task's choose split)
            and reused for the students.
        finetune_args: extra ``lit-dof fit`` arguments of every fine-tuning run (e.g.
            ``--data.init_args.train_limit=200`` to fit the protocol into a CPU budget).
        device: ``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda[:i]``: where the cells are fitted
            (``--trainer.accelerator=gpu`` is added to a CUDA fit), evaluated and scored. Every record names its
            device.
        seed: training seed of the students. 0 is the base config's own seeds and corpus order in
            ``C<budget>/<row>``; s > 0 adds ``--seed_everything=s``, ``--data.init_args.shuffle_seed=s`` (another data
            order) and the planner's ``seed=s`` for a ``DoFPlanner`` to every fit, in ``C<budget>/seed<s>/<row>``.
            The teacher has no seed: one cell serves all.

    Raises:
        DeviceError: an unknown device, or ``cuda`` asked for where none is available
            (lit_dof.devices.resolve_device).
        ValueError: an unknown retrieval task or ``ppl_split``; a negative or non-integer seed; a bad rows file.
        FileNotFoundError: no rows file, or one naming a missing config file.

    Attributes:
        known_rows: the rows of ``rows_file`` by name. gap_floor: its gap floor row (``None``: none).
    """

    out: Path = Path("runs/compare")
    base_config: Path = REPO_CONFIGS / "base.yaml"
    rows_file: Path = ROWS_FILE
    teacher: str | None = None
    corpus: str | None = None
    data_dir: str | None = None
    eval_limit: int | None = None
    mmlu_per_subject: int | None = 18
    ppl_tokens: int = 16384
    ppl_window: int = 512
    ppl_stride: int = 256
    long_contexts: tuple[int, ...] = (512, 2048, 4096, 8192)
    ppl_split: str = "test"
    long_documents: int | None = None
    retrieval_tasks: Sequence[str] = ("passkey",)
    retrieval: RetrievalGrid = field(default_factory=RetrievalGrid)
    eval_batch_size: int = 16
    retrieval_batch_size: int = 1
    fit_args: Sequence[str] = field(default_factory=tuple)
    finetune_lrs: Sequence[float] = (1e-5, 3e-5, 1e-4)
    finetune_args: Sequence[str] = field(default_factory=tuple)
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        from lit_dof.devices import resolve_device

        self.device = str(resolve_device(self.device))
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed {self.seed!r}: use an integer ≥ 0")
        if self.ppl_split not in ("test", "validation"):
            raise ValueError(f"ppl_split {self.ppl_split!r}: use test (the default) or validation")
        known = (*RETRIEVAL_TASKS, RECALL)
        unknown = sorted(set(self.retrieval_tasks) - set(known))
        if unknown:
            raise ValueError(f"unknown retrieval task(s) {unknown}; known: {', '.join(known)}")
        self.retrieval_tasks, self.fit_args = tuple(self.retrieval_tasks), tuple(self.fit_args)
        self.finetune_lrs, self.finetune_args = tuple(self.finetune_lrs), tuple(self.finetune_args)
        # Fits and fine-tuning runs are subprocesses *in the cell directory*: relative paths given on the
        # command line (``--corpus ../shared/...``) would point elsewhere there, so resolve them here.
        self.out, self.base_config = Path(self.out), Path(self.base_config).resolve()
        self.rows_file = Path(self.rows_file).resolve()
        rows = load_rows_file(self.rows_file)
        self.known_rows, self.gap_floor = {r.name: r for r in rows.rows}, rows.gap_floor
        self.corpus, self.data_dir = _absolute(self.corpus), _absolute(self.data_dir)
        if self.teacher and Path(self.teacher).exists():
            self.teacher = _absolute(self.teacher)

    def cell_dir(self, row: Row, budget: int, seed: int | None = None) -> Path:
        """``<out>/C<budget>/<row>`` for seed 0 (and the teacher), ``<out>/C<budget>/seed<s>/<row>`` otherwise;
        ``seed`` defaults to :attr:`seed`. A control row's records are in its student's cell, or shared by every
        control of the teacher behind the same window (:func:`~lit_dof.comparison.control_cells.records_folder`).

        Args:
            row: the cell's row.
            budget: its feature budget C.
            seed: its seed (default :attr:`seed`).

        Returns:
            The cell directory (not created).
        """
        if row.kind == "control":
            return records_folder(self, row, budget, seed)
        seed = self.seed if seed is None else seed
        folder = Path(self.out) / f"C{budget}"
        return (folder / f"seed{seed}" if seed and row.kind != "teacher" else folder) / row.name

    def seed_args(self, dof: bool = True) -> list[str]:
        """The fit arguments of :attr:`seed` (none for seed 0: the base config's seeds and corpus order): the run's
        seed, the data order's and, where ``dof`` (the row's planner estimates the DoF), the DoF sample's."""
        if not self.seed:
            return []
        planner = [f"{PLANNER_ARGS}.seed={self.seed}"] if dof else []
        return [f"--seed_everything={self.seed}", f"--data.init_args.shuffle_seed={self.seed}", *planner]

    # -- fit ------------------------------------------------------------------------------------------------
    def fit_command(self, row: Row, budget: int, resume: bool, dof_report: Path | None = None) -> list[str]:
        """The ``lit-dof fit`` command of a cell: its budget C is the planner's ``budget`` (a ``FixedPlanner``'s
        ``feature_dim``); a resumed cell passes ``--ckpt_path=last`` and, when its first attempt wrote one, that
        attempt's ``dof.json`` (``dof_report``) as the planner's ``report_path``, so the checkpoint's feature dims are
        rebuilt even if the DoF estimate's code or data changed in between.

        Args:
            row: the cell's row.
            budget: its feature budget C.
            resume: whether a ``last.ckpt`` exists.
            dof_report: the first attempt's ``dof.json`` (used only when resuming).

        Returns:
            The command's words.
        """
        configs = [self.base_config, *(REPO_CONFIGS / config for config in row.configs)]
        command = [sys.executable, "-m", "lit_dof", "fit"]
        command += [word for config in configs for word in ("--config", str(config))]
        dof = planner_class(configs, [*self.fit_args, *row.args]).rsplit(".", 1)[-1] != FixedPlanner.__name__
        command += [
            f"--model.init_args.teacher={self.teacher_source()}",
            f"{PLANNER_ARGS}.{'budget' if dof else 'feature_dim'}={budget}",
        ]
        command += [*self.accelerator_args(), *self.seed_args(dof), *self.fit_args, *row.args]
        if self.corpus:
            command.append(f"--data.init_args.path={self.corpus}")
        if resume and dof and dof_report is not None:
            command.append(f"{PLANNER_ARGS}.report_path={dof_report}")
        return command + (["--ckpt_path=last"] if resume else [])

    def fit(self, row: Row, budget: int) -> FitSummary:
        """Train the cell's student (or resume it); returns ``fit.json``'s content.

        Args:
            row: the cell's row.
            budget: its feature budget C.

        Returns:
            ``fit.json`` (read back when the cell is finished).

        Raises:
            CommandFailed: the fit exited with a non-zero code (the attempt is recorded in ``fit_attempts.json``).
            RuntimeError: the fit stopped before exporting its student (e.g. SIGTERM); re-running resumes it.
        """
        cell = self.cell_dir(row, budget)
        record_path = cell / FIT_FILE
        if record_path.is_file():
            return load_record(FitSummary, record_path)
        cell.mkdir(parents=True, exist_ok=True)
        timing_path = cell / ATTEMPTS_FILE
        attempts = load_attempts(timing_path)
        resume = bool(glob.glob(str(cell / "**" / "last.ckpt"), recursive=True))
        command = self.fit_command(row, budget, resume, checkpoint_dof_report(cell, attempts) if resume else None)
        start, returncode = time.time(), None
        try:
            run_logged(command, cell, f"fit of {row.name} (C={budget})")
            returncode = 0
        except CommandFailed as failure:
            returncode = failure.returncode
            raise
        finally:  # an interrupted attempt (Ctrl-C) still counts towards the cell's wall time; it resumes from last.ckpt
            written = [p for p in cell.glob("**/dof.json") if p.stat().st_mtime >= start]
            # a fresh start's DoF report: the one its checkpoints' feature dims come from
            dof_report = str(written[0].resolve()) if not resume and written else None
            attempts.append(FitAttempt(time.time() - start, returncode, resume, dof_report))
            save_attempts(timing_path, attempts)
        if not exported_since(cell, start):  # Lightning stops on SIGTERM with code 0, before the export
            attempts[-1].exported = False
            save_attempts(timing_path, attempts)
            raise RuntimeError(
                f"fit of {row.name} (C={budget}) stopped before its last step (no student exported; "
                f"was it sent SIGTERM?): re-run the command to resume it from its last checkpoint"
            )
        record = summarise_fit(cell, attempts, command, self.device_label())
        save_record(record_path, record)
        return record

    def accelerator_args(self) -> list[str]:
        """The Trainer arguments of a CUDA :attr:`device` (none on CPU: the configs' ``accelerator: cpu`` holds);
        they come before ``fit_args``, which may still override them."""
        import torch

        device = torch.device(self.device)  # validated in __post_init__
        return (
            ["--trainer.accelerator=gpu", f"--trainer.devices=[{device.index or 0}]"] if device.type == "cuda" else []
        )

    def device_label(self) -> str:
        """A short name of :attr:`device` for reports (:func:`lit_dof.devices.device_label`)."""
        from lit_dof.devices import device_label

        return device_label(self.device)

    # -- what a cell evaluates ----------------------------------------------------------------------------------
    def teacher_source(self) -> str:
        """The teacher: :attr:`teacher` when set, else ``model.init_args.teacher`` of the base config."""
        if self.teacher:
            return self.teacher
        teacher = FitConfig.load(self.base_config).teacher
        if not teacher:
            raise ValueError(f"{self.base_config} names no model.init_args.teacher: pass --teacher")
        return teacher

    def model_source(self, row: Row, budget: int) -> str:
        """What a cell evaluates: the teacher for the teacher row, else the student its fit exported.

        Args:
            row: the method.
            budget: the feature budget M of the cell.
        """
        if row.kind == "teacher":
            return self.teacher_source()
        cell = self.cell_dir(row, budget)
        return str(cell / load_record(FitSummary, cell / FIT_FILE).student)


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else path
