"""Reading a cell directory's artefacts: the fit's Lightning run folders (``metrics.jsonl``, or TensorBoard events for
runs from before it; ``config.yaml``, the exported student, ``dof.json``), its attempts (``fit_attempts.json``) and
the JSON records of each stage."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lit_dof.comparison.cell_records import (
    ATTEMPTS_FILE,
    FIT_FILE,
    EvalRecord,
    FitAttempt,
    FitSummary,
    LongContexts,
    PerplexityRecord,
    Provenance,
    RetrievalSummary,
    TaskScore,
    load_attempts,
)
from lit_dof.comparison.rows import PRIMARY_METRIC
from lit_dof.dof.report import DoFReport
from lit_dof.io import portable
from lit_dof.pipeline.fit_config import FitConfig
from lit_dof.records import load_record
from lit_dof.students.config import LitDofConfig
from lit_dof.students.surgery import layer_mean_dims, twin_layer_dims


def latest_run(cell: Path) -> Path:
    """The run folder of a cell's last exported student.

    Args:
        cell: a cell directory.

    Returns:
        The newest ``runs/*/version_*`` folder holding an exported student.

    Raises:
        FileNotFoundError: no run of the cell exported a student.
    """
    runs = sorted(cell.glob("runs/*/version_*/student"), key=lambda p: int(p.parent.name.split("_")[1]))
    if not runs:
        raise FileNotFoundError(f"no exported student under {cell}/runs/*/version_*/student")
    return runs[-1].parent


def exported_since(cell: Path, start: float) -> bool:
    """Whether a fit that began at ``start`` (``time.time()``) exported its student.

    Args:
        cell: a cell directory.
        start: the fit's start.

    Returns:
        Whether the newest run's ``student/config.json`` was written at or after ``start``.
    """
    try:
        return (latest_run(cell) / "student" / "config.json").stat().st_mtime >= start
    except FileNotFoundError:
        return False


def fit_state(cell: Path) -> str:
    """Why a cell without ``fit.json`` has nothing to show: its fit failed (last attempt's exit code) or is
    unfinished (under way, or stopped: exit code 0 with nothing exported, or killed).

    Args:
        cell: a cell directory without ``fit.json``.

    Returns:
        The reason, as the report's "not measured yet" line shows it.
    """
    attempts = load_attempts(cell / ATTEMPTS_FILE)
    code = attempts[-1].returncode if attempts else None
    if isinstance(code, int) and code != 0:
        return f"fit failed with code {code}: see {cell.name}/fit.log"
    return "fit unfinished: it resumes from its last checkpoint"


def checkpoint_dof_report(cell: Path, attempts: Sequence[FitAttempt]) -> Path | None:
    """The ``dof.json`` of the fresh start whose checkpoint a resumed cell continues: recorded by the last fresh
    attempt (``fit_attempts.json``), else — an attempt killed before it could record — the oldest one on disk.

    Args:
        cell: a cell directory.
        attempts: the cell's ``fit_attempts.json``.

    Returns:
        The absolute path of that ``dof.json``, or ``None`` when there is none.
    """
    recorded = [a.dof_report for a in attempts if not a.resumed and a.dof_report]
    if recorded and Path(recorded[-1]).is_file():
        return Path(recorded[-1])
    reports = sorted(cell.glob("**/dof.json"), key=lambda p: p.stat().st_mtime)
    return reports[0].resolve() if reports else None  # absolute: the fit runs in the cell


def validation_curve(cell: Path, metric: str = "val/ppl_student") -> list[tuple[int, float]]:
    """``(step, metric)`` from every run of a cell (resumed runs included): each run folder's ``metrics.jsonl``
    (written by every fit whatever its logger, :class:`~lit_dof.pipeline.run_files.MetricsFile`), else — runs from
    before that file existed — its TensorBoard event files.

    Args:
        cell: a cell directory.
        metric: the logged metric.

    Returns:
        The points sorted by step; a later run's value wins at a step logged twice.
    """
    points: dict[int, float] = {}
    for version in sorted(cell.glob("runs/*/version_*"), key=lambda p: (p.parent.name, int(p.name.split("_")[1]))):
        points.update(run_metric(version, metric))
    return sorted(points.items())


def run_metric(run: Path, metric: str) -> dict[int, float]:
    """One run folder's ``step → value`` of ``metric``: from its ``metrics.jsonl`` when there is one, else from its
    TensorBoard event files (empty when neither has it).

    Args:
        run: a ``runs/<name>/version_N`` folder.
        metric: the logged metric, e.g. ``val/ppl_student``.

    Returns:
        the values by step.
    """
    from lit_dof.pipeline.run_files import METRICS_FILE, read_metrics

    if (run / METRICS_FILE).is_file():
        return dict(read_metrics(run / METRICS_FILE).get(metric, []))
    if not any(run.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run)).Reload()
    if metric not in events.Tags().get("scalars", []):
        return {}
    return {e.step: e.value for e in events.Scalars(metric)}


def summarise_fit(cell: Path, attempts: list[FitAttempt], command: list[str], device: str | None = None) -> FitSummary:
    """``fit.json``: student path (relative to the cell), dims, budget, λ, J, steps, tokens seen, wall time,
    validation curve, device.

    Args:
        cell: the cell directory of a finished fit.
        attempts: its ``fit_attempts.json`` (wall time summed over them).
        command: the fit's command (recorded with :func:`~lit_dof.io.portable`).
        device: where it ran (a label, :func:`~lit_dof.devices.device_label`).

    Returns:
        The record.
    """
    run = latest_run(cell)
    config = FitConfig.load(run / "config.yaml")
    student = LitDofConfig.from_pretrained(run / "student")
    dims = student.feature_dims or None
    kinds = getattr(student.get_text_config(decoder=True), "layer_types", None)
    steps, dof = config.trainer.max_steps, run / "dof.json"
    report = DoFReport.load(dof) if dof.is_file() else None
    return FitSummary(
        student=str((run / "student").relative_to(cell)),
        feature_dims=dims,
        total_features=sum(layer_mean_dims(twin_layer_dims(dims, kinds))) if dims else None,  # per-head: their mean
        steps=steps,
        tokens=steps * config.tokens_per_step if steps and config.tokens_per_step else None,
        wall_seconds=sum(a.seconds for a in attempts),
        attempts=len(attempts),
        command=portable(command),
        val_curve=validation_curve(cell),
        strategy=config.strategy,
        lam=report and report.lam,
        lam_rule=report and report.lam_rule,
        relative_to=report and report.relative_to,
        num_samples=report and report.num_samples,
        device=device,
    )


@dataclass
class CellFiles:
    """A cell directory's finished records, each ``None`` (or empty) until its stage has run.

    Attributes:
        fit: ``fit.json``. ppl: ``ppl.json``. long: ``long.json``'s perplexity by position per context.
        long_documents: ``long_documents.json``. scores: per task, the primary metric. items: per task, the
        per-example scores of the primary metric. retrieval: per task. devices: the devices the records name.
    """

    fit: FitSummary | None
    ppl: PerplexityRecord | None
    long: dict | None
    long_documents: dict | None
    scores: dict[str, TaskScore]
    items: dict[str, list[float]]
    retrieval: dict[str, RetrievalSummary]
    devices: set[str]

    @property
    def measured(self) -> bool:
        """Whether any stage has a record (else the cell has nothing to show)."""
        return any((self.fit, self.ppl, self.long, self.long_documents, self.scores, self.retrieval))


def read_cell(cell: Path, tasks: Sequence[str]) -> CellFiles:
    """A cell directory's finished records (:class:`CellFiles`): its stages' JSON files, the primary metric of each
    task's ``eval/<task>.json`` (its SE, n, the share of examples beyond the model's exact positions and the
    per-example scores), each ``retrieval/<task>.json`` (:func:`retrieval_summary`) and the devices they name.

    Args:
        cell: a cell directory.
        tasks: the tasks to read.

    Returns:
        The records.

    Raises:
        ValueError: a record that is not JSON or not of its kind (pydantic names the field).
    """
    fit, ppl = load_record(FitSummary, cell / FIT_FILE), load_record(PerplexityRecord, cell / "ppl.json")
    long, documents = load_record(LongContexts, cell / "long.json"), _record(cell / "long_documents.json")
    retrieval = {p.stem: retrieval_summary(EvalRecord.load(p)) for p in sorted(cell.glob("retrieval/*.json"))}
    devices = {fit and fit.device, ppl and ppl.device, long and long.device, documents and documents.get("device")}
    devices |= {r.device for r in retrieval.values()}
    scores, items = {}, {}
    for task in tasks:
        path = cell / "eval" / f"{task}.json"
        if path.is_file():
            record, metric = EvalRecord.load(path), PRIMARY_METRIC[task]
            scores[task] = task_score(record, metric)
            devices.add(record.provenance.where)
            if record.items.get(metric):
                items[task] = record.items[metric]
    contexts = long and long.contexts
    return CellFiles(fit, ppl, contexts, documents, scores, items, retrieval, {d for d in devices if d})


def _record(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def task_score(record: EvalRecord, metric: str) -> TaskScore:
    """What the report keeps of an evaluation record: the task's primary ``metric`` (``acc``, ``acc_norm``, …) with
    its SE and n, and the share of examples beyond the model's exact positions.

    Args:
        record: ``eval/<task>.json``.
        metric: the task's primary metric.

    Returns:
        The score.
    """
    metrics = record.metrics
    return TaskScore(metrics.get(metric), metrics.get(f"{metric}_stderr"), metric, record.n, record.beyond_exact)


def retrieval_summary(record: EvalRecord) -> RetrievalSummary:
    """What the report keeps of a ``retrieval/<task>.json``: the score (exact match) and its SE, n, the context ×
    depth ``cells``, the per-example scores in order (``items``, for pairing two models on the same examples), the
    share of needles beyond the model's window (``None`` for full attention) and the provenance.

    Args:
        record: a retrieval stage record (:meth:`~lit_dof.comparison.stages.EvaluationStages.retrieval_stage`).

    Returns:
        The summary (records from before exact match was the metric name it ``acc``).
    """
    metric = "exact_match" if "exact_match" in record.metrics else "acc"
    beyond = [e.beyond_window for e in record.examples if e.beyond_window is not None]
    where = record.provenance
    return RetrievalSummary(
        exact_match=record.metrics.get(metric),
        exact_match_stderr=record.metrics.get(f"{metric}_stderr"),
        n=record.n,
        cells=record.cells,
        items=record.items.get(metric),
        beyond_window=sum(beyond) / len(beyond) if beyond else None,
        provenance=Provenance(device=where.device, retrieval=where.retrieval, seconds=where.seconds),
    )
