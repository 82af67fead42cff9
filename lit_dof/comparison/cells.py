"""One cell of the comparison (method row, budget, seed): its directory and each stage that fills it — the fit
(a ``lit-dof fit`` subprocess), zero-shot evaluation, held-out, long-context and long-document perplexity, and the
per-task fine-tuning protocol. Each record is written once and atomically, so a re-run skips what is finished."""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lit_dof.comparison.artefacts import checkpoint_dof_report, exported_since, summarise_fit
from lit_dof.comparison.rows import PLANNER_ARGS, REPO_CONFIGS, Row, planner_class
from lit_dof.comparison.runner import CommandFailed, run_logged
from lit_dof.data.splits import check_record_split
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.task_data import TASKS
from lit_dof.io import atomic_write_json, portable
from lit_dof.pipeline.planner import FixedPlanner


@dataclass
class Comparison:
    """Where and how to run the comparison (see :mod:`lit_dof.comparison`).

    Args:
        out: root of the cell directories.
        base_config: the recipe every student shares (default: ``configs/quickstart.yaml``).
        corpus: training/held-out corpus file (default ``$LIT_DOF_CORPUS``).
        data_dir: task data folder (default ``$LIT_DOF_DATA``).
        eval_limit: examples per task (``None``: full sets). mmlu_per_subject: MMLU subset (18 → 1026).
        ppl_tokens, ppl_window, ppl_stride: held-out perplexity stream length and sliding window (tokens).
        long_contexts: block lengths (tokens) of the ``long`` stage's perplexity by position.
        ppl_split: the corpus split the ``ppl`` and ``long`` stages score: ``test`` (default) or ``validation`` (model
            selection; the records measured before the test split existed). A cell's record of the other split is
            refused, not re-measured (:func:`~lit_dof.data.splits.check_record_split`).
        long_documents: documents of the ``long_documents`` stage (the first of the long-document test set;
            ``None``: all of them).
        fit_args: extra ``lit-dof fit`` arguments for every student (e.g. ``--trainer.max_steps=200``).
        teacher: teacher source (default: the base config's ``model.init_args.teacher``).
        finetune_lrs: the protocol's learning-rate grid, searched on the teacher and reused for the students.
        finetune_args: extra ``lit-dof fit`` arguments of every fine-tuning run (e.g.
            ``--data.init_args.train_limit=200`` to fit the protocol into a CPU budget).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda[:i]"``: where the cells are
            fitted (``--trainer.accelerator=gpu`` is added to a CUDA fit), evaluated and scored. Every record
            names its device.
        seed: training seed of the students. 0 is the base config's own seeds and corpus order in
            ``C<budget>/<row>``; s > 0 adds ``--seed_everything=s``, ``--data.init_args.shuffle_seed=s`` (another data
            order) and the planner's ``seed=s`` for a ``DoFPlanner`` to every fit, in ``C<budget>/seed<s>/<row>``.
            The teacher has no seed: one cell serves all.

    Raises:
        DeviceError: an unknown device, or ``cuda`` asked for where none is available
            (:func:`~lit_dof.devices.resolve_device`).
    """

    out: Path
    base_config: Path = REPO_CONFIGS / "quickstart.yaml"
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
    batch_size: int = 16
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
        # Fits and fine-tuning runs are subprocesses *in the cell directory*: relative paths given on the
        # command line (``--corpus ../shared/...``) would point elsewhere there, so resolve them here.
        self.base_config = Path(self.base_config).resolve()
        self.corpus, self.data_dir = _absolute(self.corpus), _absolute(self.data_dir)
        if self.teacher and Path(self.teacher).exists():
            self.teacher = _absolute(self.teacher)

    def cell_dir(self, row: Row, budget: int, seed: int | None = None) -> Path:
        """``<out>/C<budget>/<row>`` for seed 0 (and the teacher), ``<out>/C<budget>/seed<s>/<row>`` otherwise;
        ``seed`` defaults to :attr:`seed`.

        Args:
            row: the cell's row.
            budget: its feature budget C.
            seed: its seed (default :attr:`seed`).

        Returns:
            The cell directory (not created).
        """
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
        command += [f"--model.init_args.teacher={self.teacher_source()}",
                    f"{PLANNER_ARGS}.{'budget' if dof else 'feature_dim'}={budget}"]  # fmt: skip  # compact list
        command += [*self.accelerator_args(), *self.seed_args(dof), *self.fit_args, *row.args]
        if self.corpus:
            command.append(f"--data.init_args.path={self.corpus}")
        if resume and dof and dof_report is not None:
            command.append(f"{PLANNER_ARGS}.report_path={dof_report}")
        return command + (["--ckpt_path=last"] if resume else [])

    def fit(self, row: Row, budget: int) -> dict:
        """Train the cell's student (or resume it); returns ``fit.json``'s content.

        Args:
            row: the cell's row.
            budget: its feature budget C.

        Returns:
            ``fit.json``'s content (read back when the cell is finished).

        Raises:
            CommandFailed: the fit exited with a non-zero code (the attempt is recorded in ``fit_attempts.json``).
            RuntimeError: the fit stopped before exporting its student (e.g. SIGTERM); re-running resumes it.
        """
        cell = self.cell_dir(row, budget)
        record_path = cell / "fit.json"
        if record_path.is_file():
            return json.loads(record_path.read_text())
        cell.mkdir(parents=True, exist_ok=True)
        timing_path = cell / "fit_attempts.json"
        attempts = json.loads(timing_path.read_text()) if timing_path.is_file() else []
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
            attempts.append({"seconds": time.time() - start, "returncode": returncode, "resumed": resume})
            written = [p for p in cell.glob("**/dof.json") if p.stat().st_mtime >= start]
            if not resume and written:  # a fresh start: the DoF report its checkpoints' feature dims come from
                attempts[-1]["dof_report"] = str(written[0].resolve())
            atomic_write_json(timing_path, attempts)
        if not exported_since(cell, start):  # Lightning stops on SIGTERM with code 0, before the export
            attempts[-1]["exported"] = False
            atomic_write_json(timing_path, attempts)
            raise RuntimeError(
                f"fit of {row.name} (C={budget}) stopped before its last step (no student exported; "
                f"was it sent SIGTERM?): re-run the command to resume it from its last checkpoint"
            )
        record = {**summarise_fit(cell, attempts, command), "device": self.device_label()}
        atomic_write_json(record_path, record)
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

    # -- evaluation -------------------------------------------------------------------------------------------
    def teacher_source(self) -> str:
        """The teacher: :attr:`teacher` when set, else ``model.init_args.teacher`` of the base config."""
        if self.teacher:
            return self.teacher
        import yaml

        return yaml.safe_load(Path(self.base_config).read_text())["model"]["init_args"]["teacher"]

    def model_source(self, row: Row, budget: int) -> str:
        """What a cell evaluates: the teacher for the teacher row, else the student its fit exported.

        Args:
            row: the method.
            budget: the feature budget M of the cell.
        """
        if row.kind == "teacher":
            return self.teacher_source()
        cell = self.cell_dir(row, budget)
        return str(cell / json.loads((cell / "fit.json").read_text())["student"])

    def evaluate(self, row: Row, budget: int, tasks: Sequence[str] = TASKS) -> dict:
        """Zero-shot results of the cell's model, one ``eval/<task>.json`` per task (finished tasks skipped; the
        answered requests of an unfinished one are kept in ``eval/cache``, so a killed task resumes).

        Args:
            row: the cell's row.
            budget: its feature budget C.
            tasks: the tasks to evaluate.

        Returns:
            ``{task: eval/<task>.json's content}``.
        """
        from lit_dof.evaluation.harness import evaluate_model

        folder = self.cell_dir(row, budget) / "eval"
        todo = [t for t in tasks if not (folder / f"{t}.json").is_file()]
        if todo:
            model, tokenizer = load_model(self.model_source(row, budget), device=self.device)
            for task in todo:  # one task at a time: a kill loses at most one task's work
                result = evaluate_model(model, tokenizer, [task], data_dir=self.data_dir, limit=self.eval_limit,
                                        batch_size=self.batch_size,
                                        mmlu_per_subject=self.mmlu_per_subject,
                                        cache_dir=folder / "cache")  # fmt: skip  # packed args
                atomic_write_json(
                    folder / f"{task}.json", {**result["tasks"][task], "provenance": result["provenance"]}
                )
        return {t: json.loads((folder / f"{t}.json").read_text()) for t in tasks}

    def _measured(self, row: Row, budget: int, name: str, measure) -> dict:
        """The cell's ``name`` record: read back if written, else ``measure(model, tokenizer, corpus)`` with the
        cell's model on the comparison's device, timed, written atomically."""
        path = self.cell_dir(row, budget) / name
        if path.is_file():
            record = json.loads(path.read_text())
            return record if name == "long_documents.json" else check_record_split(record, self.ppl_split, path)
        corpus = self.corpus or os.environ.get("LIT_DOF_CORPUS")
        if not corpus:
            raise FileNotFoundError(f"no corpus for {name}: pass --corpus or set LIT_DOF_CORPUS")
        model, tokenizer = load_model(self.model_source(row, budget), device=self.device)
        start = time.time()
        result = measure(model, tokenizer, corpus)
        result.update(seconds=time.time() - start, device=self.device_label())
        if "source" in result:  # recorded without this machine's paths, as the commands are
            result["source"] = portable([str(result["source"])])
        atomic_write_json(path, result)
        return result

    def perplexity(self, row: Row, budget: int) -> dict:
        """Sliding-window perplexity on the held-out documents of the corpus (``ppl.json``).

        Args:
            row: the cell's row.
            budget: its feature budget C.

        Returns:
            ``ppl.json``'s content.

        Raises:
            FileNotFoundError: no corpus (``--corpus`` or ``$LIT_DOF_CORPUS``).
        """
        return self._measured(row, budget, "ppl.json", self._perplexity)

    def _perplexity(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.perplexity import heldout_perplexity
        from lit_dof.students.cache import prefill_cache_nbytes

        result = heldout_perplexity(model, tokenizer, corpus, max_tokens=self.ppl_tokens, window=self.ppl_window,
                                    stride=self.ppl_stride, split=self.ppl_split)  # fmt: skip  # packed args
        # what decoding keeps per sequence at the scored context (a teacher's KV cache; a student's state)
        result["state"] = {"context": self.ppl_window, "bytes": prefill_cache_nbytes(model, self.ppl_window)}
        return result

    def long_context(self, row: Row, budget: int) -> dict:
        """Perplexity by position at every context of ``long_contexts``, returned and written as ``long.json``
        (arguments and errors as :meth:`perplexity`): the held-out documents concatenated (EOS between them) and
        cut into disjoint blocks of that many tokens, ``ppl_tokens`` tokens per context, buckets 0–63 / 64–255 /
        256–511 / 512–2047 / 2048–4095 / 4096–8191 within the block."""
        return self._measured(row, budget, "long.json", self._long_context)

    def _long_context(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.perplexity import long_context_perplexity

        return long_context_perplexity(model, tokenizer, corpus, self.long_contexts, self.ppl_tokens, self.ppl_split)

    def long_document_perplexity(self, row: Row, budget: int) -> dict:
        """The long-document test set by in-document position, written as ``long_documents.json`` (arguments and
        errors as :meth:`perplexity`; :func:`lit_dof.evaluation.long_documents.long_document_perplexity`, the first
        :attr:`long_documents` documents, each truncated to the model's max positions)."""
        return self._measured(row, budget, "long_documents.json", self._long_documents)

    def _long_documents(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.long_documents import long_document_perplexity

        return long_document_perplexity(model, tokenizer, corpus, max_documents=self.long_documents)

    # -- the paper's per-task fine-tuning protocol (METHOD.md §4) -----------------------------------------
    def _finetune_run(self, source: str, task: str, lr: float, folder: Path) -> dict:
        """One fine-tuning fit (subprocess, in ``folder``); returns its ``finetune.json``."""
        result_path = folder / "result.json"
        if result_path.is_file():
            return json.loads(result_path.read_text())
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "lit_dof", "fit", "--config",
                   str(REPO_CONFIGS / "finetune" / "arc_easy.yaml"), f"--data.init_args.task={task}",
                   f"--model.init_args.teacher={source}", f"--model.init_args.lr={lr}"]  # fmt: skip  # compact list
        if self.data_dir:
            command.append(f"--data.init_args.data_dir={self.data_dir}")
        if task == "mmlu":  # the paper: MMLU 1 epoch, last
            command += ["--trainer.max_epochs=1", "--model.init_args.selection=last"]
            if self.mmlu_per_subject:
                command.append(f"--data.init_args.mmlu_per_subject={self.mmlu_per_subject}")
        command += [*self.accelerator_args(), *self.finetune_args]
        start = time.time()
        run_logged(command, folder, f"fine-tuning {source} on {task} (lr {lr})")
        summaries = sorted(folder.glob("runs/*/version_*/finetune.json"), key=os.path.getmtime)
        result = {
            **json.loads(summaries[-1].read_text()),
            "wall_seconds": time.time() - start,
            "command": portable(command),
        }
        atomic_write_json(result_path, result)
        return result

    def finetune_lr(self, task: str) -> float:
        """The protocol's learning rate for ``task``: the best of :attr:`finetune_lrs` on the teacher.

        Args:
            task: a task with training data.

        Returns:
            The selected learning rate (also written to ``finetune_lr/<task>/selected.json``).
        """
        folder = Path(self.out) / "finetune_lr" / task
        scores = {
            lr: self._finetune_run(self.teacher_source(), task, lr, folder / f"lr{lr:g}")["score"]
            for lr in self.finetune_lrs
        }
        best = max(scores, key=lambda lr: scores[lr])
        atomic_write_json(
            folder / "selected.json", {"task": task, "scores": {f"{k:g}": v for k, v in scores.items()}, "lr": best}
        )
        return best

    def finetune(self, row: Row, budget: int, task: str) -> dict:
        """Fine-tune the cell's model on ``task`` at the teacher-selected learning rate (``finetune/<task>.json``).

        Args:
            row: the cell's row.
            budget: its feature budget C.
            task: a task with training data.

        Returns:
            ``finetune/<task>.json``'s content.
        """
        path = self.cell_dir(row, budget) / "finetune" / f"{task}.json"
        if path.is_file():
            return json.loads(path.read_text())
        lr = self.finetune_lr(task)
        if row.kind == "teacher":
            result = self._finetune_run(
                self.teacher_source(), task, lr, Path(self.out) / "finetune_lr" / task / f"lr{lr:g}"
            )
        else:
            result = self._finetune_run(self.model_source(row, budget), task, lr, path.parent / task)
        atomic_write_json(path, result)
        return result


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else path
