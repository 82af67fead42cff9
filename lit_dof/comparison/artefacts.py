"""Reading a cell directory's artefacts: the fit's Lightning run folders (``metrics.jsonl``, or TensorBoard events for
runs from before it; ``config.yaml``, the exported student, ``dof.json``), its attempts (``fit_attempts.json``) and
the JSON records of each stage."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from lit_dof.comparison.rows import PRIMARY_METRIC
from lit_dof.io import portable
from lit_dof.students.surgery import layer_mean_dims


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
    attempts = json.loads((cell / "fit_attempts.json").read_text()) if (cell / "fit_attempts.json").is_file() else []
    code = attempts[-1]["returncode"] if attempts else None
    if isinstance(code, int) and code != 0:
        return f"fit failed with code {code}: see {cell.name}/fit.log"
    return "fit unfinished: it resumes from its last checkpoint"


def checkpoint_dof_report(cell: Path, attempts: Sequence[dict]) -> Path | None:
    """The ``dof.json`` of the fresh start whose checkpoint a resumed cell continues: recorded by the last fresh
    attempt (``fit_attempts.json``), else — an attempt killed before it could record — the oldest one on disk.

    Args:
        cell: a cell directory.
        attempts: the cell's ``fit_attempts.json``.

    Returns:
        The absolute path of that ``dof.json``, or ``None`` when there is none.
    """
    recorded = [a["dof_report"] for a in attempts if not a.get("resumed") and a.get("dof_report")]
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


def summarise_fit(cell: Path, attempts: list[dict], command: list[str]) -> dict:
    """``fit.json``: student path (relative to the cell), dims, budget, λ, J, steps, tokens seen, wall time,
    validation curve.

    Args:
        cell: the cell directory of a finished fit.
        attempts: its ``fit_attempts.json`` (wall time summed over them).
        command: the fit's command (recorded with :func:`~lit_dof.io.portable`).

    Returns:
        The record.
    """
    import yaml

    run = latest_run(cell)
    config = yaml.safe_load((run / "config.yaml").read_text())
    student_config = json.loads((run / "student" / "config.json").read_text())
    dims = student_config.get("feature_dims")
    steps = int(config["trainer"]["max_steps"])
    data = config["data"]["init_args"]
    total = sum(layer_mean_dims(dims)) if dims else None  # per-head dims count as their mean per layer
    record = {
        "student": str((run / "student").relative_to(cell)),
        "feature_dims": dims,
        "total_features": total,
        "steps": steps,
        "tokens": steps * int(data["batch_size"]) * int(data["seq_len"]),
        "wall_seconds": sum(a["seconds"] for a in attempts),
        "attempts": len(attempts),
        "command": portable(command),
        "val_curve": validation_curve(cell),
    }
    record["strategy"] = allocation_strategy(config)
    dof_path = run / "dof.json"
    if dof_path.is_file():
        dof = json.loads(dof_path.read_text())
        record.update(
            lam=dof.get("lam"),
            lam_rule=dof.get("lam_rule"),
            relative_to=dof.get("relative_to"),
            num_samples=dof.get("num_samples"),
        )
    return record


def allocation_strategy(config: dict) -> str | None:
    """The allocation strategy of a fit's saved ``config.yaml``: its planner's (``fix`` for a ``FixedPlanner``), or
    its ``allocator:`` group's (configs from before the planners).

    Args:
        config: the parsed ``config.yaml``.

    Returns:
        ``"dof"``, ``"dof_clip"``, ``"dof_head"``, ``"fix"``, or ``None`` when it names none.
    """
    planner = ((config.get("model") or {}).get("init_args") or {}).get("planner")
    if not isinstance(planner, dict):
        return (config.get("allocator") or {}).get("strategy")
    if str(planner.get("class_path", "")).endswith("FixedPlanner"):
        return "fix"
    return (planner.get("init_args") or {}).get("strategy")


def read_cell(cell: Path, tasks: Sequence[str]) -> dict:
    """A cell directory's finished records: ``fit``, ``ppl``, ``long``, ``long_documents`` (``None`` when missing),
    ``scores`` (task → primary metric, its SE, n), ``items`` (task → per-example scores), ``retrieval`` (task →
    :func:`retrieval_summary`) and the ``devices`` they name.

    Args:
        cell: a cell directory.
        tasks: the tasks to read.

    Returns:
        ``{"fit", "ppl", "long", "long_documents", "scores", "items", "retrieval", "devices"}``.
    """
    names = ("fit.json", "ppl.json", "long.json", "long_documents.json")
    fit, ppl, long, documents = (_record(cell / name) for name in names)
    retrieval = {p.stem: retrieval_summary(json.loads(p.read_text())) for p in sorted(cell.glob("retrieval/*.json"))}
    scores, items = {}, {}
    devices = {record.get("device") for record in (fit, ppl, long, documents) if record}
    devices |= {(r["provenance"] or {}).get("device") for r in retrieval.values()}
    for task in tasks:
        path = cell / "eval" / f"{task}.json"
        if not path.is_file():
            continue
        entry = json.loads(path.read_text())
        devices.add(_eval_device(entry.get("provenance") or {}))
        metric = PRIMARY_METRIC[task]
        scores[task] = {
            "value": entry.get(metric),
            "stderr": entry.get(f"{metric}_stderr"),
            "metric": metric,
            "n": entry.get("n"),
        }
        if entry.get("beyond_exact") is not None:  # the share of examples past a student's exact positions
            scores[task]["beyond_exact"] = entry["beyond_exact"]
        if (entry.get("items") or {}).get(metric):
            items[task] = entry["items"][metric]
    found = {"fit": fit, "ppl": ppl, "long": long, "long_documents": documents, "scores": scores, "items": items}
    return {**found, "retrieval": retrieval, "devices": devices}


def _record(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def retrieval_summary(record: dict) -> dict:
    """What the report keeps of a ``retrieval/<task>.json``: the score (exact match) and its SE, n, the context ×
    depth ``cells``, the per-example scores in order (``items``, for pairing two models on the same examples), the
    share of needles beyond the model's window (``None`` for full attention) and the provenance.

    Args:
        record: a retrieval stage record (:meth:`~lit_dof.comparison.stages.EvaluationStages.retrieval_stage`).

    Returns:
        ``{"exact_match", "exact_match_stderr", "n", "cells", "items", "beyond_window", "provenance"}``.
    """
    examples = record.get("examples") or []
    beyond = [e["beyond_window"] for e in examples if "beyond_window" in e]
    items = record.get("items") or {}
    return {
        "exact_match": record.get("exact_match", record.get("acc")),
        "exact_match_stderr": record.get("exact_match_stderr", record.get("acc_stderr")),
        "n": record.get("n"),
        "cells": record.get("cells"),
        "items": items.get("exact_match") or items.get("acc"),
        "beyond_window": sum(beyond) / len(beyond) if beyond else None,
        "provenance": {k: (record.get("provenance") or {}).get(k) for k in ("device", "retrieval", "seconds")},
    }


def _eval_device(provenance: dict) -> str | None:
    """An evaluation's device; records from before ``device`` was kept say only whether CUDA was available,
    and the comparison then ran on the CPU."""
    return provenance.get("device") or ("cpu" if provenance.get("cuda") is False else None)
