"""The comparison runner (``lit-dof compare``): one teacher, one or more feature budgets, every method
trained the same way and evaluated the same way — the paper's Table 3, resumable cell by cell.

A **cell** is (method row, budget, seed). Its directory ``<out>/C<budget>/<row>/`` (seed 0) or
``<out>/C<budget>/seed<s>/<row>/`` holds, each written once and atomically, so a re-run skips whatever is
finished:

* the fit: ``lit-dof fit`` run as a subprocess *in the cell directory* (the quickstart config's relative
  log/checkpoint paths land there; a killed fit resumes with ``--ckpt_path last``); ``fit.json`` records
  its wall time (summed over attempts), steps, tokens seen, dims, λ, J and the validation curve;
* ``eval/<task>.json``: zero-shot lm-eval results per task (:func:`~lit_dof.evaluation.harness.evaluate_model`);
* ``ppl.json``: sliding-window perplexity on the held-out documents, and perplexity by token position in
  disjoint ``ppl_window`` blocks (``by_position``, buckets 0–63 / 64–255 / 256–511 for 512);
* ``long.json`` (stage ``long``): perplexity by position in blocks of 512 to 8192 tokens (long context).

:func:`write_report` gathers every finished cell into ``comparison.json``, ``comparison.md`` (methods ×
tasks, average, perplexity, budget, λ, J, tokens, wall time, and the fraction of the teacher–Performer
gap each method closes) and ``comparison.png``: average accuracy vs total feature budget (one line per
method), validation perplexity vs step, and each curve divided by its reference row's at the same step (the
λ study's "has the ranking stopped changing"). Every row's reference is Fix trained with the same loss
(:class:`Row`), so paired differences isolate the allocation. With several ``--seeds`` the report adds each
method's mean and spread over the seeds and its difference from the reference with a standard error over
the seeds: one training run cannot tell two methods apart when the run-to-run spread is as large as their
difference.

The report is the durable record: ``comparison.json`` keeps each cell's per-example scores, and a re-render
carries over the cells of the earlier ``comparison.json`` in the report folder whose run directories are
gone (``--carry``, :func:`collect`), so a lost scratch folder costs checkpoints, not results.
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from lit_dof.config_files import config_root
from lit_dof.evaluation.stats import paired_difference
from lit_dof.evaluation.task_data import TASKS, TRAIN_SPLITS
from lit_dof.io import atomic_write_json, atomic_write_text
from lit_dof.students.surgery import layer_mean_dims

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_CONFIGS = config_root()


def portable(command: Sequence[str]) -> str:
    """A recorded command without this machine's paths: the interpreter as ``python``, repository paths
    relative to its root, and paths beside the repository as ``../``."""
    text = " ".join(command).replace(sys.executable, "python")
    return text.replace(f"{REPO_ROOT}/", "").replace(f"{REPO_ROOT.parent}/", "../")
PRIMARY_METRIC = {"piqa": "acc_norm", "logiqa": "acc_norm", "arc_easy": "acc_norm", "arc_challenge": "acc_norm",
                  "winogrande": "acc", "wsc273": "acc", "mmlu": "acc"}  # fmt: skip
"""The metric shown per task (lm-eval's usual headline: acc_norm where defined for multi-word choices)."""


@dataclass(frozen=True)
class Row:
    """One method of the comparison: config files (relative to ``configs/``) and extra CLI arguments
    composed on top of the base config. ``kind``: ``"teacher"`` (no fit) or ``"student"``. ``reference``: the
    row it is measured against at the same budget (paired task differences, validation-perplexity ratios):
    Fix trained with the same loss, so that DoF − Fix isolates the allocation."""

    name: str
    configs: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    kind: str = "student"
    note: str = ""
    reference: str = "fix"


UNTRAINED = ("--trainer.max_steps=1", "--trainer.val_check_interval=1", "--model.init_args.finetune_fraction=0")
ROWS: dict[str, Row] = {r.name: r for r in [
    Row("teacher", kind="teacher", note="softmax attention"),
    Row("performer", ("methods/performer.yaml",), UNTRAINED, note="FAVOR+, untrained"),
    Row("fix", ("methods/fix.yaml",), note="learned PRF, uniform M, softmax loss"),
    Row("dof", ("methods/dof.yaml",), note="learned PRF, DoF allocation (λ auto), softmax loss"),
    Row("dof_clip", ("methods/dof_clip.yaml",), note="DoF capped at C, softmax loss"),
    Row("fix_l2", ("methods/fix.yaml", "methods/l2.yaml"), note="L2 kernel loss"),
    Row("dof_l2", ("methods/dof.yaml", "methods/l2.yaml"), note="L2 kernel loss", reference="fix_l2"),
    Row("dof_clip_l2", ("methods/dof_clip.yaml", "methods/l2.yaml"), note="L2 kernel loss", reference="fix_l2"),
    Row("direct", ("methods/dof.yaml", "methods/direct.yaml"), note="end-to-end next-token loss, DoF dims"),
    Row("dijiang", ("methods/dijiang.yaml",), note="DCT features, uniform M"),
    Row("hedgehog", ("methods/hedgehog.yaml",), note="softmax-of-linear features, uniform M"),
    # Sliding-window rows: the untrained controls (the teacher behind a 64-token window, with and without 4
    # attention sinks) and the window + linear recipes measured against the window-plus-sink control.
    Row("swa_only", ("methods/swa_only.yaml",), note="window 64, nothing trained", reference="swa_sink"),
    Row("swa_sink", ("methods/swa_sink.yaml",), note="window 64 + 4 sinks, nothing trained", reference="swa_sink"),
    Row("swa_linear", ("methods/swa_linear.yaml",), note="window 64 + learned PRF far term, DoF dims",
        reference="swa_sink"),
    Row("swa_sink_linear", ("methods/swa_sink_linear.yaml",), note="window 64 + 4 sinks + learned PRF far term, "
        "DoF dims", reference="swa_sink"),
    Row("swa_sink_linear_shift", ("methods/swa_sink_linear.yaml",), ("--model.init_args.position_shift=7680",),
        note="swa_sink_linear trained at random absolute positions (offsets up to 7680)", reference="swa_sink"),
    # The λ study (METHOD.md §2): DoF at fixed absolute λ and with the relative rule, next to "dof" (auto).
    Row("dof_lam2^48", ("methods/dof.yaml",), ("--dof.lam=281474976710656",), note="λ = 2^48"),
    Row("dof_lam2^56", ("methods/dof.yaml",), ("--dof.lam=72057594037927936",), note="λ = 2^56"),
    Row("dof_lam2^64", ("methods/dof.yaml",), ("--dof.lam=18446744073709551616",), note="λ = 2^64"),
    Row("dof_rel_trace", ("methods/dof.yaml",), ("--dof.relative_to=trace", "--dof.lam=0.00390625"),
        note="λ = 2^-8 · tr(G)/J"),
]}  # fmt: skip
"""The default rows (``--rows`` picks a subset, in any order)."""


@dataclass
class Comparison:
    """Where and how to run the comparison (see the module docstring).

    Args:
        out: root of the cell directories.
        base_config: the recipe every student shares (default: ``configs/quickstart.yaml``).
        corpus: training/held-out corpus file (default ``$LIT_DOF_CORPUS``).
        data_dir: task data folder (default ``$LIT_DOF_DATA``).
        eval_limit: examples per task (``None``: full sets). mmlu_per_subject: MMLU subset (18 → 1026).
        ppl_tokens, ppl_window, ppl_stride: held-out perplexity stream length and sliding window (tokens).
        long_contexts: block lengths (tokens) of the ``long`` stage's perplexity by position.
        fit_args: extra ``lit-dof fit`` arguments for every student (e.g. ``--trainer.max_steps=200``).
        teacher: teacher source (default: the base config's ``model.init_args.teacher``).
        finetune_lrs: the protocol's learning-rate grid, searched on the teacher and reused for the students.
        finetune_args: extra ``lit-dof fit`` arguments of every fine-tuning run (e.g.
            ``--data.init_args.train_limit=200`` to fit the protocol into a CPU budget).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda[:i]"``: where the cells are
            fitted (``--trainer.accelerator=gpu`` is added to a CUDA fit), evaluated and scored. Every record
            names its device.
        seed: training seed of the students. 0 is the base config's own seeds (``seed_everything``, the DoF
            sample's ``dof.seed``) in ``C<budget>/<row>``; s > 0 adds ``--seed_everything=s --dof.seed=s``
            to every fit, in ``C<budget>/seed<s>/<row>``. The teacher has no seed: one cell serves all.

    Raises:
        ValueError: an unknown device; RuntimeError: ``cuda`` asked for where none is available.
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
    batch_size: int = 16
    fit_args: Sequence[str] = field(default_factory=tuple)
    finetune_lrs: Sequence[float] = (1e-5, 3e-5, 1e-4)
    finetune_args: Sequence[str] = field(default_factory=tuple)
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        import torch

        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        kind, _, index = self.device.partition(":")
        if kind not in ("cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
            raise ValueError(f"device {self.device!r}: use auto, cpu or cuda[:index]")
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {self.device!r} asked for, but torch sees no CUDA device: use --device cpu")
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
        ``seed`` defaults to :attr:`seed`."""
        seed = self.seed if seed is None else seed
        folder = Path(self.out) / f"C{budget}"
        return (folder / f"seed{seed}" if seed and row.kind != "teacher" else folder) / row.name

    def seed_args(self) -> list[str]:
        """The fit arguments of :attr:`seed` (none for seed 0: the base config's seeds)."""
        return [f"--seed_everything={self.seed}", f"--dof.seed={self.seed}"] if self.seed else []

    # -- fit ------------------------------------------------------------------------------------------------
    def fit_command(self, row: Row, budget: int, resume: bool, dof_report: Path | None = None) -> list[str]:
        """The ``lit-dof fit`` command of a cell; a resumed cell passes ``--ckpt_path=last`` and, when its first
        attempt wrote one, that attempt's ``dof.json`` (``dof_report``), so the checkpoint's feature dims are
        rebuilt even if the DoF estimate's code or data changed in between."""
        command = [sys.executable, "-m", "lit_dof.pipeline.cli", "fit", "--config", str(self.base_config)]
        for config in row.configs:
            command += ["--config", str(REPO_CONFIGS / config)]
        command += [f"--model.init_args.teacher={self.teacher_source()}", f"--allocator.budget={budget}"]
        command += [*self.accelerator_args(), *self.seed_args(), *self.fit_args, *row.args]
        if self.corpus:
            command.append(f"--data.init_args.path={self.corpus}")
        if resume and dof_report is not None:
            command.append(f"--dof.report_path={dof_report}")
        return command + (["--ckpt_path=last"] if resume else [])

    def fit(self, row: Row, budget: int) -> dict:
        """Train the cell's student (or resume it); returns ``fit.json``'s content."""
        cell = self.cell_dir(row, budget)
        record_path = cell / "fit.json"
        if record_path.is_file():
            return json.loads(record_path.read_text())
        cell.mkdir(parents=True, exist_ok=True)
        timing_path = cell / "fit_attempts.json"
        attempts = json.loads(timing_path.read_text()) if timing_path.is_file() else []
        resume = bool(glob.glob(str(cell / "**" / "last.ckpt"), recursive=True))
        command = self.fit_command(row, budget, resume, _checkpoint_dof_report(cell, attempts) if resume else None)
        start, returncode = time.time(), None
        try:
            with open(cell / "fit.log", "a") as log:
                log.write(f"\n$ (cd {cell} && {' '.join(command)})\n")
                log.flush()
                returncode = subprocess.run(command, cwd=cell, stdout=log, stderr=subprocess.STDOUT).returncode
        finally:  # an interrupted attempt (Ctrl-C) still counts towards the cell's wall time; it resumes from last.ckpt
            attempts.append({"seconds": time.time() - start, "returncode": returncode, "resumed": resume})
            written = [p for p in cell.glob("**/dof.json") if p.stat().st_mtime >= start]
            if not resume and written:  # a fresh start: the DoF report its checkpoints' feature dims come from
                attempts[-1]["dof_report"] = str(written[0].resolve())
            atomic_write_json(timing_path, attempts)
        if returncode != 0:
            raise RuntimeError(f"fit of {row.name} (C={budget}) failed with code {returncode}; see {cell / 'fit.log'}")
        if not _exported_since(cell, start):  # Lightning stops on SIGTERM with code 0, before the export
            attempts[-1]["exported"] = False
            atomic_write_json(timing_path, attempts)
            raise RuntimeError(f"fit of {row.name} (C={budget}) stopped before its last step (no student exported; "
                               f"was it sent SIGTERM?): re-run the command to resume it from its last checkpoint")
        record = {**summarise_fit(cell, attempts, command), "device": self.device_label()}
        atomic_write_json(record_path, record)
        return record

    def accelerator_args(self) -> list[str]:
        """The Trainer arguments of a CUDA :attr:`device` (none on CPU: the configs' ``accelerator: cpu`` holds);
        they come before ``fit_args``, which may still override them."""
        import torch

        device = torch.device(self.device)  # validated in __post_init__
        return ["--trainer.accelerator=gpu", f"--trainer.devices=[{device.index or 0}]"] if device.type == "cuda" else []

    def device_label(self) -> str:
        from lit_dof.evaluation.harness import device_label

        return device_label(self.device)

    # -- evaluation -------------------------------------------------------------------------------------------
    def teacher_source(self) -> str:
        if self.teacher:
            return self.teacher
        import yaml

        return yaml.safe_load(Path(self.base_config).read_text())["model"]["init_args"]["teacher"]

    def model_source(self, row: Row, budget: int) -> str:
        if row.kind == "teacher":
            return self.teacher_source()
        cell = self.cell_dir(row, budget)
        return str(cell / json.loads((cell / "fit.json").read_text())["student"])

    def evaluate(self, row: Row, budget: int, tasks: Sequence[str] = TASKS) -> dict:
        """Zero-shot results of the cell's model, one ``eval/<task>.json`` per task (finished tasks skipped)."""
        from lit_dof.evaluation.cli import load_model
        from lit_dof.evaluation.harness import evaluate_model

        folder = self.cell_dir(row, budget) / "eval"
        todo = [t for t in tasks if not (folder / f"{t}.json").is_file()]
        if todo:
            model, tokenizer = load_model(self.model_source(row, budget), device=self.device)
            for task in todo:  # one task at a time: a kill loses at most one task's work
                result = evaluate_model(model, tokenizer, [task], data_dir=self.data_dir, limit=self.eval_limit,
                                        batch_size=self.batch_size, mmlu_per_subject=self.mmlu_per_subject)  # fmt: skip
                atomic_write_json(folder / f"{task}.json", {**result["tasks"][task], "provenance": result["provenance"]})
        return {t: json.loads((folder / f"{t}.json").read_text()) for t in tasks}

    def _measured(self, row: Row, budget: int, name: str, measure) -> dict:
        """The cell's ``name`` record: read back if written, else ``measure(model, tokenizer, corpus)`` with the
        cell's model on the comparison's device, timed, written atomically."""
        from lit_dof.evaluation.cli import load_model

        path = self.cell_dir(row, budget) / name
        if path.is_file():
            return json.loads(path.read_text())
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
        """Sliding-window perplexity on the held-out documents of the corpus (``ppl.json``)."""
        return self._measured(row, budget, "ppl.json", self._perplexity)

    def _perplexity(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.perplexity import corpus_perplexity, heldout_documents, position_perplexity, text_tokens

        result = corpus_perplexity(model, tokenizer, corpus, max_tokens=self.ppl_tokens, window=self.ppl_window,
                                   stride=self.ppl_stride)  # fmt: skip
        tokens = text_tokens(heldout_documents(corpus), tokenizer, self.ppl_tokens)
        block = min(self.ppl_window, tokens.numel())  # a stream shorter than the window is one block
        edges = [e for e in (0, 64, 256) if e < block] + [block]
        result["by_position"] = position_perplexity(model, tokens, block=block, edges=edges)
        return result

    def long_context(self, row: Row, budget: int) -> dict:
        """Perplexity by position at every context of ``long_contexts`` (``long.json``): the held-out documents
        concatenated (EOS between them) and cut into disjoint blocks of that many tokens, ``ppl_tokens`` tokens
        per context, buckets 0–63 / 64–255 / 256–511 / 512–2047 / 2048–4095 / 4096–8191 within the block."""
        return self._measured(row, budget, "long.json", self._long_context)

    def _long_context(self, model, tokenizer, corpus: str) -> dict:
        from lit_dof.evaluation.perplexity import heldout_documents, position_perplexity, text_tokens

        tokens = text_tokens(heldout_documents(corpus), tokenizer, max(self.ppl_tokens, max(self.long_contexts)))
        result: dict = {"contexts": {}, "source": str(corpus)}
        for context in self.long_contexts:
            edges = [e for e in (0, 64, 256, 512, 2048, 4096) if e < context] + [context]
            usable = tokens[: max(context, self.ppl_tokens // context * context)]
            result["contexts"][str(context)] = position_perplexity(model, usable, block=context, edges=edges, batch_size=1)
        return result

    # -- the paper's per-task fine-tuning protocol (METHOD.md §4) -----------------------------------------
    def _finetune_run(self, source: str, task: str, lr: float, folder: Path) -> dict:
        """One fine-tuning fit (subprocess, in ``folder``); returns its ``finetune.json``."""
        result_path = folder / "result.json"
        if result_path.is_file():
            return json.loads(result_path.read_text())
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "lit_dof.pipeline.cli", "fit", "--config",
                   str(REPO_CONFIGS / "finetune" / "arc_easy.yaml"), f"--data.init_args.task={task}",
                   f"--model.init_args.teacher={source}", f"--model.init_args.lr={lr}"]  # fmt: skip
        if self.data_dir:
            command.append(f"--data.init_args.data_dir={self.data_dir}")
        if task == "mmlu":  # the paper: MMLU 1 epoch, last
            command += ["--trainer.max_epochs=1", "--model.init_args.selection=last"]
            if self.mmlu_per_subject:
                command.append(f"--data.init_args.mmlu_per_subject={self.mmlu_per_subject}")
        command += [*self.accelerator_args(), *self.finetune_args]
        start = time.time()
        with open(folder / "fit.log", "a") as log:
            log.write(f"\n$ (cd {folder} && {' '.join(command)})\n")
            log.flush()
            code = subprocess.run(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise RuntimeError(f"fine-tuning {source} on {task} (lr {lr}) failed with code {code}; see {folder / 'fit.log'}")
        summaries = sorted(folder.glob("runs/*/version_*/finetune.json"), key=os.path.getmtime)
        result = {**json.loads(summaries[-1].read_text()), "wall_seconds": time.time() - start, "command": portable(command)}
        atomic_write_json(result_path, result)
        return result

    def finetune_lr(self, task: str) -> float:
        """The protocol's learning rate for ``task``: the best of :attr:`finetune_lrs` on the teacher."""
        folder = Path(self.out) / "finetune_lr" / task
        scores = {lr: self._finetune_run(self.teacher_source(), task, lr, folder / f"lr{lr:g}")["score"]
                  for lr in self.finetune_lrs}  # fmt: skip
        best = max(scores, key=lambda lr: scores[lr])
        atomic_write_json(folder / "selected.json", {"task": task, "scores": {f"{k:g}": v for k, v in scores.items()},
                                                      "lr": best})  # fmt: skip
        return best

    def finetune(self, row: Row, budget: int, task: str) -> dict:
        """Fine-tune the cell's model on ``task`` at the teacher-selected learning rate (``finetune/<task>.json``)."""
        path = self.cell_dir(row, budget) / "finetune" / f"{task}.json"
        if path.is_file():
            return json.loads(path.read_text())
        lr = self.finetune_lr(task)
        if row.kind == "teacher":
            result = self._finetune_run(self.teacher_source(), task, lr, Path(self.out) / "finetune_lr" / task / f"lr{lr:g}")
        else:
            result = self._finetune_run(self.model_source(row, budget), task, lr, path.parent / task)
        atomic_write_json(path, result)
        return result


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else path


def _exported_since(cell: Path, start: float) -> bool:
    """Whether a fit that began at ``start`` (``time.time()``) exported its student."""
    try:
        return (_latest_run(cell) / "student" / "config.json").stat().st_mtime >= start
    except FileNotFoundError:
        return False


def _fit_state(cell: Path) -> str:
    """Why a cell without ``fit.json`` has nothing to show: its fit failed (last attempt's exit code) or is
    unfinished (under way, or stopped: exit code 0 with nothing exported, or killed)."""
    attempts = json.loads((cell / "fit_attempts.json").read_text()) if (cell / "fit_attempts.json").is_file() else []
    code = attempts[-1]["returncode"] if attempts else None
    if isinstance(code, int) and code != 0:
        return f"fit failed with code {code}: see {cell.name}/fit.log"
    return "fit unfinished: it resumes from its last checkpoint"


def _latest_run(cell: Path) -> Path:
    runs = sorted(cell.glob("runs/*/version_*/student"), key=lambda p: int(p.parent.name.split("_")[1]))
    if not runs:
        raise FileNotFoundError(f"no exported student under {cell}/runs/*/version_*/student")
    return runs[-1].parent


def validation_curve(cell: Path) -> list[tuple[int, float]]:
    """``(step, val/ppl_student)`` from every TensorBoard log of a cell (resumed runs included)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, float] = {}
    for version in sorted(cell.glob("runs/*/version_*")):
        events = EventAccumulator(str(version)).Reload()
        if "val/ppl_student" in events.Tags().get("scalars", []):
            points.update({e.step: e.value for e in events.Scalars("val/ppl_student")})
    return sorted(points.items())


def summarise_fit(cell: Path, attempts: list[dict], command: list[str]) -> dict:
    """``fit.json``: student path (relative to the cell), dims, budget, λ, J, steps, tokens seen, wall time,
    validation curve."""
    import yaml

    run = _latest_run(cell)
    config = yaml.safe_load((run / "config.yaml").read_text())
    student_config = json.loads((run / "student" / "config.json").read_text())
    dims = student_config.get("feature_dims")
    steps = int(config["trainer"]["max_steps"])
    data = config["data"]["init_args"]
    total = sum(layer_mean_dims(dims)) if dims else None  # per-head dims count as their mean per layer
    record = {"student": str((run / "student").relative_to(cell)), "feature_dims": dims, "total_features": total,
              "steps": steps, "tokens": steps * int(data["batch_size"]) * int(data["seq_len"]),
              "wall_seconds": sum(a["seconds"] for a in attempts), "attempts": len(attempts),
              "command": portable(command), "val_curve": validation_curve(cell)}  # fmt: skip
    record["strategy"] = (config.get("allocator") or {}).get("strategy")
    dof_path = run / "dof.json"
    if dof_path.is_file():
        dof = json.loads(dof_path.read_text())
        record.update(lam=dof.get("lam"), lam_rule=dof.get("lam_rule"), relative_to=dof.get("relative_to"),
                      num_samples=dof.get("num_samples"))  # fmt: skip
    return record


# -- the report ---------------------------------------------------------------------------------------------
def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def grid(rows: Sequence[Row], budgets: Sequence[int], seeds: Sequence[int]):
    """The cells to run or report, as ``(budget, seed, row)`` in table order; the teacher once (first budget
    and seed): it has neither."""
    for budget in budgets:
        for seed in seeds:
            for row in rows:
                if row.kind != "teacher" or (budget == budgets[0] and seed == seeds[0]):
                    yield budget, seed, row


def _checkpoint_dof_report(cell: Path, attempts: Sequence[dict]) -> Path | None:
    """The ``dof.json`` of the fresh start whose checkpoint a resumed cell continues: recorded by the last fresh
    attempt (``fit_attempts.json``), else — an attempt killed before it could record — the oldest one on disk."""
    recorded = [a["dof_report"] for a in attempts if not a.get("resumed") and a.get("dof_report")]
    if recorded and Path(recorded[-1]).is_file():
        return Path(recorded[-1])
    reports = sorted(cell.glob("**/dof.json"), key=lambda p: p.stat().st_mtime)
    return reports[0].resolve() if reports else None  # absolute: the fit runs in the cell


def _read_cell(cell: Path, tasks: Sequence[str]) -> dict:
    """A cell directory's finished records: ``fit``, ``ppl`` (``None`` when missing), ``scores`` (task →
    primary metric, its SE, n), ``items`` (task → per-example scores) and the ``devices`` they name."""
    fit = json.loads((cell / "fit.json").read_text()) if (cell / "fit.json").is_file() else None
    ppl = json.loads((cell / "ppl.json").read_text()) if (cell / "ppl.json").is_file() else None
    long = json.loads((cell / "long.json").read_text()) if (cell / "long.json").is_file() else None
    scores, items = {}, {}
    devices = {record.get("device") for record in (fit, ppl) if record}
    for task in tasks:
        path = cell / "eval" / f"{task}.json"
        if not path.is_file():
            continue
        entry = json.loads(path.read_text())
        devices.add(_eval_device(entry.get("provenance") or {}))
        metric = PRIMARY_METRIC[task]
        scores[task] = {"value": entry.get(metric), "stderr": entry.get(f"{metric}_stderr"), "metric": metric,
                        "n": entry.get("n")}  # fmt: skip
        if (entry.get("items") or {}).get(metric):
            items[task] = entry["items"][metric]
    return {"fit": fit, "ppl": ppl, "long": long, "scores": scores, "items": items, "devices": devices}


def _pair_with_reference(c: dict, items: dict, reference: dict, tasks: Sequence[str]) -> None:
    """Set ``c["vs_reference"]`` (per task, :func:`paired_difference` of the per-example scores) and, with every
    task paired, ``c["vs_reference_average"]`` (tasks are disjoint example sets: SE √(Σ SE²) / n)."""
    c["vs_reference"] = {task: dict(zip(("difference", "stderr", "n"), paired_difference(items[task], values)))
                         for task, values in reference.items() if len(items.get(task, ())) == len(values)}  # fmt: skip
    if len(c["vs_reference"]) == len(tasks):
        per_task = list(c["vs_reference"].values())
        c["vs_reference_average"] = {"difference": _mean(d["difference"] for d in per_task),
                                     "stderr": math.sqrt(sum(d["stderr"] ** 2 for d in per_task)) / len(per_task)}


def encode_items(values: Sequence[float]) -> str | list[float]:
    """Per-example scores as stored in ``comparison.json``: a string of ``0``/``1`` when every score is 0 or 1
    (accuracies: one byte per example), else the list itself."""
    return "".join(str(int(v)) for v in values) if all(v in (0, 1) for v in values) else list(values)


def decode_items(stored: str | Sequence[float]) -> list[float]:
    """The inverse of :func:`encode_items`."""
    return [float(ch) for ch in stored] if isinstance(stored, str) else list(stored)


def _carry(previous: dict, tasks: Sequence[str]) -> tuple[dict, dict]:
    """A cell of an earlier report, as :func:`collect` builds one: scores and per-example items restricted to
    ``tasks``, average recomputed, the comparisons (gap closed, paired differences) recomputed by the caller;
    its earlier paired differences kept under ``prior_vs_reference`` for cells stored without items."""
    c = {k: v for k, v in previous.items() if k not in ("items", "gap_closed", "vs_reference", "vs_reference_average")}
    c["scores"] = {t: s for t, s in (previous.get("scores") or {}).items() if t in tasks}
    c["average"] = _mean(s["value"] for s in c["scores"].values()) if len(c["scores"]) == len(tasks) else None
    c["carried"] = True
    if previous.get("vs_reference"):
        c["prior_vs_reference"] = {k: previous.get(k) for k in ("vs_reference", "vs_reference_average")}
    items = {t: decode_items(v) for t, v in (previous.get("items") or {}).items() if t in tasks}
    return c, items


def collect(comparison: Comparison, rows: Sequence[Row], budgets: Sequence[int], tasks: Sequence[str] = TASKS,
            seeds: Sequence[int] = (0,), previous: dict | None = None) -> dict:  # fmt: skip
    """Every finished part of every cell (missing parts are ``None``); ``pending`` names the selected rows with
    no cell yet or with a fit still under way (nothing to show). Cells of one budget and seed are compared
    with each other (gap closed, paired differences); ``seed_summary`` (:func:`seed_summary`) pools the seeds.

    ``previous``: an earlier ``comparison.json`` (the report is the durable record; run directories hold
    checkpoints and may be scratch space). A selected cell with nothing under ``comparison.out`` is taken
    whole from it, marked ``carried`` and listed in ``report["carried"]``; a cell found under ``out`` always
    wins. Each cell keeps its per-example scores (``items``, :func:`encode_items`) so that a carried cell is
    still paired with a re-measured one; a cell from a report written before items were kept keeps its
    earlier paired difference only while its reference row is carried too (the same measurements)."""
    cells, items = [], []  # items[i][task]: cell i's per-example scores of the task's primary metric
    pending, carried = [], []  # the table names them instead of silently leaving them out
    earlier = {(c["row"], c["budget"], c.get("seed")): c for c in (previous or {}).get("cells", [])}
    teacher_dir = comparison.cell_dir(ROWS["teacher"], budgets[0]) if "teacher" in [r.name for r in rows] else None
    for budget, seed, row in grid(rows, budgets, seeds):
        cell = comparison.cell_dir(row, budget, seed) if row.kind != "teacher" else teacher_dir
        label = row.name + (f" (seed {seed})" if seed and row.kind != "teacher" else "")
        where = label + ("" if len(budgets) == 1 else f" (C={budget})")
        found = _read_cell(cell, tasks) if cell is not None and cell.is_dir() else None
        empty = found is None or (found["fit"] is None and not found["scores"] and found["ppl"] is None)
        key = (row.name, budget, seed if row.kind != "teacher" else None)
        if empty and key in earlier:
            c, found_items = _carry(earlier[key], tasks)
            cells.append(c)
            items.append(found_items)
            carried.append(where)
            continue
        if found is None:
            pending.append(where)
            continue
        if empty and row.kind != "teacher":
            pending.append(f"{where} ({_fit_state(cell)})")  # a fit under way: nothing to show
            continue
        items.append(found["items"])
        finetuned = {p.stem: json.loads(p.read_text())["score"] for p in sorted((cell / "finetune").glob("*.json"))}
        scores, ppl = found["scores"], found["ppl"]
        cells.append({"row": row.name, "label": label, "seed": seed if row.kind != "teacher" else None,
                      "note": row.note, "budget": budget, "kind": row.kind, "fit": found["fit"],
                      "reference": row.reference if row.kind != "teacher" and row.reference != row.name else None,
                      "scores": scores, "average": _mean(s["value"] for s in scores.values())
                      if len(scores) == len(tasks) else None, "ppl": ppl["ppl"] if ppl else None,
                      "ppl_setting": _ppl_setting(ppl), "finetuned": finetuned,
                      "by_position": (ppl or {}).get("by_position"), "long": (found["long"] or {}).get("contexts"),
                      "devices": sorted(d for d in found["devices"] if d),
                      "items": {t: encode_items(v) for t, v in found["items"].items()}})  # fmt: skip
    teacher = next((c for c in cells if c["kind"] == "teacher"), None)
    for budget, seed in ((b, s) for b in budgets for s in seeds):
        group = [(c, found) for c, found in zip(cells, items) if c["budget"] == budget and c["seed"] == seed]
        performer = next((c for c, _ in group if c["row"] == "performer"), None) or next(  # this seed's floor,
            (c for c in cells if c["row"] == "performer" and c["budget"] == budget), None)  # else another seed's
        by_row = {c["row"]: found for c, found in group}
        for c, found in group:
            ok = teacher and performer and None not in (c["average"], teacher["average"], performer["average"])
            gap = (teacher["average"] - performer["average"]) if ok else None
            c["gap_closed"] = (c["average"] - performer["average"]) / gap if ok and gap else None
            if c["reference"] in by_row:  # not for a reference itself, or one not measured (or not selected)
                _pair_with_reference(c, found, by_row[c["reference"]], tasks)
            prior = c.pop("prior_vs_reference", None)
            reference = next((r for r, _ in group if r["row"] == c["reference"]), None)
            if prior and reference is not None and reference.get("carried") and \
                    len(c.get("vs_reference") or {}) < len(prior.get("vs_reference") or {}):  # fmt: skip
                c.update({k: v for k, v in prior.items() if v is not None})  # same measurements, no items to re-pair
    if teacher is not None:  # 1 by definition, wherever a gap is defined
        teacher["gap_closed"] = 1.0 if any(c.get("gap_closed") is not None for c in cells if c is not teacher) else None
    report = {"budgets": list(budgets), "seeds": list(seeds), "tasks": list(tasks), "primary_metric": PRIMARY_METRIC,
              "cells": cells, "pending": pending, "carried": carried}  # fmt: skip
    report["seed_summary"] = seed_summary(report)
    return report


def _eval_device(provenance: dict) -> str | None:
    """An evaluation's device; records from before ``device`` was kept say only whether CUDA was available,
    and the comparison then ran on the CPU."""
    return provenance.get("device") or ("cpu" if provenance.get("cuda") is False else None)




def _ppl_setting(ppl: dict | None) -> str | None:
    if not ppl:
        return None
    return f"{ppl['tokens']} tokens, window {ppl['window']}, stride {ppl['stride']}"


def _fmt(value, digits=3):
    return "–" if value is None else f"{value:.{digits}f}"


def _scored(report: dict) -> bool:
    """Whether any cell has task scores (else a perplexity-only study such as the λ study)."""
    return any(c["scores"] for c in report["cells"])


def _fmt_tokens(tokens) -> str:
    """A token count in the largest unit that keeps it above 1 (``1.64M``, ``1.0k``, ``512``); "–" when unknown."""
    if not tokens:
        return "–"
    if tokens >= 1e6:
        return f"{tokens / 1e6:.2f}M"
    return f"{tokens / 1e3:.1f}k" if tokens >= 1e3 else str(int(tokens))


def markdown(report: dict, header: str = "") -> str:
    """The Table-3-shaped markdown of :func:`collect`'s report."""
    tasks = report["tasks"]
    scored = _scored(report)  # a perplexity-only study (the λ study) drops the task columns
    lines = [header] if header else []
    columns = ["method", *(tasks + ["avg", "gap closed"] if scored else []), "ppl", "C", "Σ M", "λ", "J", "tokens",
               "fit wall", "note"]  # fmt: skip
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for c in report["cells"]:
        fit = c["fit"] or {}
        uses_dof = fit.get("strategy") in ("dof", "dof_clip")
        lam = fit.get("lam") if uses_dof else None
        lam_text = "–" if lam is None else f"2^{math.log2(lam):.1f}" + (" (auto)" if fit.get("lam_rule") == "auto" else "")
        if lam is not None and fit.get("relative_to"):
            lam_text += " · tr(G)/J" if fit["relative_to"] == "trace" else f" · {fit['relative_to']}(G)"
        wall = fit.get("wall_seconds")
        scores = [*[_fmt(c["scores"].get(t, {}).get("value")) for t in tasks], _fmt(c["average"]),
                  _fmt(c.get("gap_closed"), 2)] if scored else []
        row = [_label(c), *scores, _fmt(c["ppl"], 1), str(c["budget"]) if c["kind"] != "teacher" else "–",
               str(fit.get("total_features") or "–"), lam_text, str(fit.get("num_samples") or "–") if uses_dof else "–",
               _fmt_tokens(fit.get("tokens")),
               f"{wall / 60:.0f} min" if wall else "–", c["note"]]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    if report.get("pending"):
        lines += ["", "Not measured yet (re-running the command resumes here): " + ", ".join(report["pending"]) + "."]
    if report.get("carried"):
        lines += ["", "Carried from this folder's earlier comparison.json (no run directory of theirs under the "
                  "output folder now; their records are unchanged): " + ", ".join(report["carried"]) + "."]
    finetuned_tasks = sorted({t for c in report["cells"] for t in c.get("finetuned", {})})
    if finetuned_tasks:
        lines += ["", "Fine-tuned per task (METHOD.md §4; accuracy of the best epoch, MMLU: last; learning rate from "
                  "the teacher's grid):", "", "| method | " + " | ".join(finetuned_tasks) + " |",
                  "|" + "---|" * (len(finetuned_tasks) + 1)]  # fmt: skip
        for c in report["cells"]:
            if c.get("finetuned"):
                scores = [_fmt(c["finetuned"].get(t)) for t in finetuned_tasks]
                lines.append(f"| {_label(c)} | " + " | ".join(scores) + " |")
    lines += paired_table(report)
    lines += seed_table(report)
    lines += curve_table(report)
    lines += _position_sections(report)
    lines += ["", _device_note(report), ""]
    lines.append("Metrics: " + ", ".join(f"{t} {m}" for t, m in report["primary_metric"].items() if t in tasks) +
                 ". gap closed = (avg − Performer avg) / (teacher avg − Performer avg). ppl: sliding-window "
                 "perplexity on held-out Wikipedia documents" + _ppl_note(report) + ".")  # fmt: skip
    return "\n".join(lines)


def _position_sections(report: dict) -> list[str]:
    """Perplexity by position and at long contexts (:mod:`~lit_dof.evaluation.position_report`), each cell paired
    with the teacher and with its reference row of the same budget and seed."""
    from lit_dof.evaluation.position_report import long_context_lines, position_lines

    labels = {(c["row"], c["budget"], c.get("seed")): _label(c) for c in report["cells"]}  # hand-made: no seed
    teacher = next((_label(c) for c in report["cells"] if c["kind"] == "teacher"), None)
    models = [{"label": _label(c), "by_position": c.get("by_position"), "long": c.get("long"),
               "reference": labels.get((c["reference"], c["budget"], c.get("seed"))) if c.get("reference") else None}
              for c in report["cells"]]  # fmt: skip
    return position_lines(models, teacher) + long_context_lines(models, teacher)


def _device_note(report: dict) -> str:
    """Where the cells were measured (fits, perplexity, evaluations): one device for all, or per cell."""
    several = len({c["budget"] for c in report["cells"]}) > 1
    per_cell = {_label(c) + (f" (C={c['budget']})" if several else ""): c.get("devices") or ["not recorded"]
                for c in report["cells"]}  # fmt: skip
    if len({tuple(d) for d in per_cell.values()}) == 1:
        return "Device: " + " and ".join(next(iter(per_cell.values()))) + " (every cell)."
    return "Devices: " + "; ".join(f"{row}: {' and '.join(d)}" for row, d in per_cell.items()) + "."


def _ppl_note(report: dict) -> str:
    """The perplexity setting of the report's cells; names the cells when they differ (not comparable)."""
    settings: dict[str, list[str]] = {}
    for c in report["cells"]:
        if c.get("ppl_setting"):
            settings.setdefault(c["ppl_setting"], []).append(_label(c))
    if not settings:
        return ""
    if len(settings) == 1:
        return f" ({next(iter(settings))})"
    each = "".join(f"; {', '.join(rows)}: {setting}" for setting, rows in settings.items())
    return each + " — **settings differ, so these perplexities are not comparable**"


def _spread(values: Sequence[float]) -> dict | None:
    """Mean, sample standard deviation (``None`` for one value) and count of ``values``; ``None`` if empty."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return {"mean": mean, "sd": sd, "n": len(values)}


def _over_seeds(per_seed: dict) -> dict | None:
    """:func:`_spread` of per-seed values, with the standard error over seeds ``stderr`` = sd/√n (2+ seeds)."""
    spread = _spread(list(per_seed.values()))
    if spread and spread["sd"] is not None:
        spread["stderr"] = spread["sd"] / math.sqrt(spread["n"])
    return spread


def seed_summary(report: dict) -> list[dict]:
    """Per (row, budget) trained with two or more seeds: the seven-task average and the perplexity over the
    seeds (mean, standard deviation); per seed, the average paired difference from the reference row (same
    budget and seed) and the perplexity ratio to it, and both over the seeds: mean ± standard error sd/√n.
    That standard error measures what one run's paired SE cannot — the spread of training itself (random
    features, the DoF sample)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for c in report["cells"]:
        if c["kind"] != "teacher":
            groups.setdefault((c["row"], c["budget"]), []).append(c)
    by_cell = {_cell_key(c["row"], c): c for c in report["cells"]}
    summary = []
    for (row, budget), group in groups.items():
        if len({c["seed"] for c in group}) < 2:
            continue
        differences, ratios = {}, {}
        for c in group:
            reference = by_cell.get(_cell_key(c["reference"], c)) if c["reference"] else None
            if c.get("vs_reference_average"):
                differences[c["seed"]] = c["vs_reference_average"]["difference"]
            if reference and c["ppl"] is not None and reference["ppl"]:
                ratios[c["seed"]] = c["ppl"] / reference["ppl"]
        summary.append({"row": row, "budget": budget, "seeds": [c["seed"] for c in group],
                        "reference": group[0]["reference"], "average": _spread([c["average"] for c in group]),
                        "ppl": _spread([c["ppl"] for c in group]),
                        "vs_reference_per_seed": differences, "vs_reference": _over_seeds(differences),
                        "ppl_ratio_per_seed": ratios, "ppl_ratio": _over_seeds(ratios)})  # fmt: skip
    return summary


def seed_table(report: dict) -> list[str]:
    """Markdown lines of :func:`seed_summary` (empty when no row has two seeds); a perplexity-only study
    (:func:`_scored` false) drops the accuracy columns."""
    summary = report.get("seed_summary") or []
    if not summary:
        return []
    scored = _scored(report)

    def spread(s: dict | None, digits: int) -> str:
        if s is None:
            return "–"
        return f"{s['mean']:.{digits}f}" + ("" if s["sd"] is None else f" ± {s['sd']:.{digits}f}")

    def over(s: dict | None, fmt: str) -> str:
        if s is None:
            return "–"
        return fmt.format(s["mean"]) + (f" ± {fmt.format(s['stderr']).lstrip('+')} (n={s['n']})"
                                        if s.get("stderr") is not None else " (n=1)")  # fmt: skip

    columns = ["method", "vs", "C", "seeds", *(["avg"] if scored else []), "ppl", "ppl / vs, per seed",
               "ppl / vs, over seeds", *(["− vs, per seed", "− vs, over seeds"] if scored else [])]  # fmt: skip
    legend = (f"{'avg, ppl' if scored else 'ppl'}: mean ± standard deviation over the seeds; ppl / vs: perplexity "
              "divided by the reference row's of the same seed"
              + ("; − vs: the average paired difference from the reference row in points" if scored else "")
              + "; per seed, then mean ± standard error over the seeds, which includes the spread of training")
    lines = ["", f"Over seeds ({legend}):", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for s in summary:
        ratios = ", ".join(f"{r:.3f} (s{seed})" for seed, r in s["ppl_ratio_per_seed"].items()) or "–"
        cells = [s["row"], s["reference"] or "–", str(s["budget"]), ", ".join(map(str, s["seeds"])),
                 *([spread(s["average"], 3)] if scored else []), spread(s["ppl"], 1), ratios,
                 over(s["ppl_ratio"], "{:.3f}")]  # fmt: skip
        if scored:  # in points
            points = s["vs_reference"] and {k: v if k == "n" or v is None else 100 * v
                                            for k, v in s["vs_reference"].items()}  # fmt: skip
            cells += [", ".join(f"{100 * d:+.1f} (s{seed})" for seed, d in s["vs_reference_per_seed"].items()) or "–",
                      over(points, "{:+.1f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def paired_table(report: dict) -> list[str]:
    """Markdown lines: each method minus its reference row (Fix with the same loss, :class:`Row`) at the same
    budget on the same examples (± paired standard error, :func:`paired_difference`), per task, and a line naming
    the evaluated cells whose reference is evaluated too but could not be paired (a side without per-example
    scores); empty when neither exists."""
    paired = [c for c in report["cells"] if c.get("vs_reference")]
    evaluated = {_cell_key(c["row"], c) for c in report["cells"] if c.get("scores")}
    unpaired = [c for c in report["cells"] if c.get("scores") and not c.get("vs_reference")
                and _cell_key(c.get("reference"), c) in evaluated]  # fmt: skip
    lines = _paired_rows(report, paired) if paired else []
    if unpaired:
        lines += ["", "Not paired (one side has no per-example scores, e.g. a reference carried from a report "
                  "written before they were kept; evaluating both cells again pairs them): "
                  + ", ".join(f"{_label(c)} vs {c['reference']} (C = {c['budget']})" for c in unpaired) + "."]
    return lines


def _paired_rows(report: dict, paired: list[dict]) -> list[str]:
    """The markdown table of :func:`paired_table` for the ``paired`` cells."""
    tasks = [t for t in report["tasks"] if any(t in c["vs_reference"] for c in paired)]
    lines = ["", "Difference from the reference row (`vs`: Fix with the same loss) at the same budget, on the same "
             "examples (points of the primary metric, ± paired standard error; – where either cell lacks per-example "
             "scores; avg: over the tasks, standard error √(Σ SE²) / number of tasks):", "",
             "| method | vs | C | " + " | ".join(tasks) + " | avg |", "|" + "---|" * (len(tasks) + 4)]  # fmt: skip
    for c in paired:
        diffs = [c["vs_reference"].get(t) for t in tasks] + [c.get("vs_reference_average")]
        lines.append(f"| {_label(c)} | {c['reference']} | {c['budget']} | " + " | ".join(
            "–" if d is None else f"{100 * d['difference']:+.1f} ± {100 * d['stderr']:.1f}" for d in diffs) + " |")
    return lines


def _cell_key(row: str | None, c: dict) -> tuple[str | None, int, int | None]:
    """``(row, budget, seed)``: the cell of ``row`` at ``c``'s budget and seed, the key by which the tables find
    a cell's reference (``row``: ``c``'s own row or its reference; a hand-built cell without a seed is seed 0)."""
    return row, c["budget"], c.get("seed", 0)


def _label(c: dict) -> str:
    """A cell's name in tables and legends: its row, and its seed when not 0."""
    return c.get("label") or c["row"]


def _curves(report: dict) -> dict[tuple[str, int, int | None], dict[int, float]]:
    """``{(row, budget, seed): {step: validation perplexity}}`` of every cell with a validation curve."""
    return {_cell_key(c["row"], c): dict(c["fit"]["val_curve"]) for c in report["cells"]
            if (c["fit"] or {}).get("val_curve")}  # fmt: skip


def _reference_curve(c: dict, curves: dict) -> dict[int, float]:
    """The validation curve ``c`` is divided by: its reference row's at the same budget and seed (a reference
    row is its own, ratio 1); empty when that cell has none."""
    return curves.get(_cell_key(c.get("reference") or c["row"], c), {})


def curve_table(report: dict, tail: int = 5) -> list[str]:
    """Markdown lines: each fitted cell's validation perplexity at every validation step and, where its
    reference row (``vs``: Fix with the same loss) has a curve at the same budget, the ratio to it at the last
    shared step and the mean ratio over the last ``tail`` shared steps (one validation point is noisy:
    single-seed curves wobble by ~5%). That mean is "–" for a curve with fewer than ``tail`` shared steps: a
    few widely spaced validations can span different stages (the full recipe validates once after the
    layer-wise stage and once after the end-to-end tail), whose mean answers no question. Empty when no cell
    has a curve."""
    curved = [c for c in report["cells"] if (c["fit"] or {}).get("val_curve")]
    if not curved:
        return []
    steps = sorted({step for c in curved for step, _ in c["fit"]["val_curve"]})
    curves = _curves(report)
    lines = ["", "Validation perplexity during the fit (held-out blocks; step = optimizer step index):", "",
             "| method | vs | C | Σ M | dims | " + " | ".join(str(s) for s in steps) +
             f" | / vs (last) | / vs (mean of last {tail}) |", "|" + "---|" * (len(steps) + 7)]  # fmt: skip
    for c in curved:
        curve, dims = dict(c["fit"]["val_curve"]), c["fit"].get("feature_dims") or []
        reference = _reference_curve(c, curves)
        ratios = [curve[s] / reference[s] for s in steps if s in curve and s in reference]
        cells = [_label(c), c.get("reference") or "–", str(c["budget"]), str(sum(dims)) if dims else "–",
                 f"{min(dims)}…{max(dims)}" if dims else "–",
                 *[_fmt(curve.get(s), 1) for s in steps], _fmt(ratios[-1] if ratios else None),
                 _fmt(_mean(ratios[-tail:]) if len(ratios) >= tail else None)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(report: dict, path: Path) -> None:
    """Average accuracy vs total feature budget (one line per method; held-out perplexity instead in a
    perplexity-only study such as the λ study), validation curves and, where the reference row (Fix with the
    same loss) has one, each curve divided by the reference's at the same step (the λ study's "has the
    ranking stopped changing")."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    plt.close(fig)


def figure(report: dict):
    """The matplotlib figure of :func:`plot` (Agg backend; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = _curves(report)
    relative = [c for c in report["cells"] if c.get("reference") and c["fit"] and c["fit"].get("val_curve")
                and _reference_curve(c, curves)]  # fmt: skip
    fig, axes = plt.subplots(1, 3 if relative else 2, figsize=(16 if relative else 11, 4))
    ax, bx = axes[:2]
    colors = {row: f"C{i % 10}" for i, row in enumerate(dict.fromkeys(c["row"] for c in report["cells"]))}  # same row, same colour
    scored = _scored(report)  # else perplexity-only: the budget panel plots perplexity
    metric = "average" if scored else "ppl"
    by_row: dict[str, dict[int, list]] = {}  # row -> budget -> (Σ M, value) of each seed
    for c in report["cells"]:
        if c[metric] is not None and c["kind"] != "teacher":
            point = ((c["fit"] or {}).get("total_features") or 0, c[metric])
            by_row.setdefault(c["row"], {}).setdefault(c["budget"], []).append(point)
        if c["fit"] and c["fit"].get("val_curve"):
            steps, values = zip(*c["fit"]["val_curve"])
            bx.plot(steps, values, marker="o", color=colors[c["row"]], label=f"{_label(c)} (C={c['budget']})")
    for name, budgets in sorted(by_row.items()):  # one point per budget: the mean over seeds, bars ± 1 sd
        points = sorted((_mean(x for x, _ in seeds), _spread([y for _, y in seeds])) for seeds in budgets.values())
        xs, ys = [x for x, _ in points], [p["mean"] for _, p in points]
        ax.plot(xs, ys, marker="o", color=colors[name], label=name)
        if any(p["sd"] is not None for _, p in points):
            ax.errorbar(xs, ys, yerr=[p["sd"] or 0.0 for _, p in points], fmt="none", color=colors[name], capsize=3)
    teacher = next((c for c in report["cells"] if c["kind"] == "teacher" and c[metric] is not None), None)
    if teacher:
        ax.axhline(teacher[metric], color="k", linestyle="--", label="teacher")
    ax.set_xlabel("total feature budget Σ M (features)")
    ax.set_ylabel("average zero-shot accuracy" if scored else "held-out perplexity (sliding window)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7 if scored else 6)
    else:
        ax.text(0.5, 0.5, "no seven-task averages yet" if scored else "no perplexities yet", ha="center",
                va="center", transform=ax.transAxes)  # fmt: skip
    bx.set_xlabel("optimizer step")
    bx.set_ylabel("held-out perplexity (validation)")
    bx.set_yscale("log")
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=6)
    if relative:  # the λ study's question, directly: is each method ahead of Fix, and has that stopped changing?
        cx = axes[2]
        for c in relative:
            reference = _reference_curve(c, curves)
            shared = [(step, value / reference[step]) for step, value in c["fit"]["val_curve"] if step in reference]
            if shared:
                cx.plot(*zip(*shared), marker="o", color=colors[c["row"]],
                        label=f"{_label(c)} / {c['reference']} (C={c['budget']})")  # fmt: skip
        cx.axhline(1.0, color="k", linestyle="--", label="reference (Fix, same loss)")
        cx.set_xlabel("optimizer step")
        cx.set_ylabel("validation perplexity / reference's (same step)")
        cx.legend(fontsize=6)
    fig.tight_layout()
    return fig


def write_report(comparison: Comparison, rows: Sequence[Row], budgets: Sequence[int], report_dir: Path,
                 header: str = "", seeds: Sequence[int] = (0,), carry: bool = True) -> dict:  # fmt: skip
    """``comparison.json``, ``comparison.md`` and ``comparison.png`` in ``report_dir`` (atomic). With ``carry``,
    cells of the ``comparison.json`` already there that have no run directory now are kept (:func:`collect`).

    Raises:
        ValueError: ``carry`` and an existing ``comparison.json`` that is not a readable report.
    """
    report_dir = Path(report_dir)
    previous = None
    if carry and (report_dir / "comparison.json").is_file():
        try:
            previous = json.loads((report_dir / "comparison.json").read_text())
            if not isinstance(previous.get("cells"), list):
                raise ValueError("no 'cells' list")
        except (ValueError, AttributeError) as error:
            raise ValueError(f"{report_dir / 'comparison.json'} is not a comparison report ({error}): move it away "
                             f"or pass --carry false to write the report from the run directories only") from error
    report = collect(comparison, rows, budgets, seeds=seeds, previous=previous)
    atomic_write_json(report_dir / "comparison.json", report)
    atomic_write_text(report_dir / "comparison.md", markdown(report, header) + "\n")
    plot(report, report_dir / "comparison.png")
    return report


def compare(
    rows: list[str] = list(ROWS),
    budgets: list[int] = [64],
    out: str = "runs/compare",
    report_dir: str | None = None,
    stages: list[str] = ["fit", "ppl", "eval"],
    tasks: list[str] = list(TASKS),
    base_config: str | None = None,
    teacher: str | None = None,
    corpus: str | None = None,
    data_dir: str | None = None,
    eval_limit: int | None = None,
    mmlu_per_subject: int | None = 18,
    ppl_tokens: int = 16384,
    fit_args: list[str] = [],
    finetune_tasks: list[str] = list(TRAIN_SPLITS),
    finetune_lrs: list[float] = [1e-5, 3e-5, 1e-4],
    finetune_args: list[str] = [],
    device: str = "auto",
    eval_batch_size: int = 16,
    seeds: list[int] = [0],
    carry: bool = True,
) -> dict:
    """Run (or resume) the comparison and write its report.

    Args:
        rows: method rows (default: all of :data:`ROWS`, teacher first).
        budgets: per-layer mean feature dims C (the total budget is L · C).
        out: cell directories. report_dir: where comparison.{json,md,png} go (default: ``out``).
        stages: which of ``fit``, ``ppl``, ``long``, ``eval``, ``finetune`` to run now (the report is always
            rewritten; ``long`` — perplexity by position up to 8192 tokens of context — and ``finetune`` — the
            paper's protocol — are opt-in: they are the costliest stages on a CPU).
        tasks: which tasks the ``eval`` stage runs now (the report always shows all seven; missing cells are –).
        base_config: shared recipe (default configs/quickstart.yaml). teacher: override its teacher.
        corpus: corpus file (default ``$LIT_DOF_CORPUS``). data_dir: task data (default ``$LIT_DOF_DATA``).
        eval_limit: examples per task. mmlu_per_subject: MMLU subset (18 per subject → 1026 questions).
        ppl_tokens: held-out tokens for the perplexity column.
        fit_args: extra ``lit-dof fit`` arguments for every student.
        finetune_tasks: tasks of the protocol (those with training data offline).
        finetune_lrs: the learning-rate grid searched on the teacher, reused for the students.
        finetune_args: extra arguments of every fine-tuning fit (e.g. ``--data.init_args.train_limit=200``).
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``, for every stage (see :class:`Comparison`).
        eval_batch_size: loglikelihood requests per forward in the ``eval`` stage (results depend on it only
            through float rounding).
        seeds: training seeds of every student row (see :class:`Comparison`'s ``seed``; 0: the base config's
            seeds). With two or more the report adds the spread over seeds (:func:`seed_summary`).
        carry: keep the cells of ``report_dir``'s earlier ``comparison.json`` that have no run directory under
            ``out`` (a lost or cleaned scratch folder; each is marked in the table); ``false``: only ``out``.

    Raises:
        ValueError: an unknown row, stage or device; seeds that are repeated or negative.
    """
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise ValueError(f"unknown row(s) {unknown}; known: {', '.join(ROWS)}")
    unknown_tasks = sorted(set(tasks) - set(TASKS))
    if unknown_tasks:
        raise ValueError(f"unknown task(s) {unknown_tasks}; known: {', '.join(TASKS)}")
    bad = sorted(set(stages) - {"fit", "ppl", "long", "eval", "finetune"})
    if bad:
        raise ValueError(f"unknown stage(s) {bad}; use fit, ppl, long, eval, finetune")
    if not seeds or len(set(seeds)) != len(seeds) or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds {seeds}: give distinct integers ≥ 0 (e.g. [0, 1, 2])")
    comparison = Comparison(out=Path(out), base_config=Path(base_config) if base_config else REPO_CONFIGS / "quickstart.yaml",
                            teacher=teacher, corpus=corpus or os.environ.get("LIT_DOF_CORPUS"),
                            data_dir=data_dir or os.environ.get("LIT_DOF_DATA"),
                            eval_limit=eval_limit, mmlu_per_subject=mmlu_per_subject, ppl_tokens=ppl_tokens,
                            fit_args=tuple(fit_args), finetune_lrs=tuple(finetune_lrs),
                            finetune_args=tuple(finetune_args), device=device,
                            batch_size=eval_batch_size)  # fmt: skip
    selected = [ROWS[name] for name in rows]
    for budget, seed, row in grid(selected, budgets, seeds):
        seeded = replace(comparison, seed=seed)
        seed_note = f" seed {seed}" if seed and row.kind != "teacher" else ""
        print(f"[compare] C={budget} {row.name}{seed_note}", flush=True)
        if row.kind != "teacher" and "fit" in stages:
            seeded.fit(row, budget)
        ready = row.kind == "teacher" or (seeded.cell_dir(row, budget) / "fit.json").is_file()
        if ready and "ppl" in stages:
            seeded.perplexity(row, budget)
        if ready and "long" in stages:
            seeded.long_context(row, budget)
        if ready and "eval" in stages:
            seeded.evaluate(row, budget, tasks)
        if ready and "finetune" in stages:
            for task in finetune_tasks:
                seeded.finetune(row, budget, task)
    return write_report(comparison, selected, budgets, Path(report_dir or out), seeds=seeds, carry=carry)


def main(args: list[str] | None = None) -> None:
    """Entry of ``lit-dof compare``."""
    import signal

    from jsonargparse import auto_cli

    def stop(signum, frame):  # SIGTERM (a batch scheduler, `kill`) ends the run as Ctrl-C does: the fit under way
        raise KeyboardInterrupt(f"signal {signum}")  # is stopped, its attempt recorded, and it resumes from last.ckpt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        auto_cli(compare, args=args, as_positional=False, prog="lit-dof compare")
    finally:
        signal.signal(signal.SIGTERM, previous)
