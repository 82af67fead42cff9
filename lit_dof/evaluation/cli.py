"""``lit-dof eval``: zero-shot accuracy of a teacher or an exported student on the paper's tasks, offline.

    lit-dof eval --model smollm2-135m-instruct --tasks '[arc_easy, piqa]' --data_dir $LIT_DOF_DATA
    lit-dof eval --model runs/quickstart/version_0/student --limit 200 --output eval.json
    lit-dof eval --model smollm2-135m-instruct --device cuda:1 --dtype bfloat16
    lit-dof eval --model runs/quickstart/version_0/student --cache_dir eval_cache   # resumable

Prints a table (acc and acc_norm with standard errors, examples per task) and, with ``--output``, writes
the numbers and their provenance (versions, settings, wall time) as JSON, atomically.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from lit_dof.devices import device_errors_exit, resolve_device, resolve_model_dtype
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.task_data import TASKS
from lit_dof.precision import DtypeName
from lit_dof.teacher import DEFAULT_TEACHER


def format_table(results: dict) -> str:
    """Markdown table of :func:`~lit_dof.evaluation.harness.evaluate_model` results."""

    def cell(entry, metric):
        if metric not in entry:
            return "–"
        stderr = entry.get(f"{metric}_stderr")
        return f"{entry[metric]:.4f} ± {stderr:.4f}" if stderr is not None else f"{entry[metric]:.4f}"

    lines = ["| task | acc | acc_norm | n |", "|---|---|---|---|"]
    for task, entry in results["tasks"].items():
        lines.append(f"| {task} | {cell(entry, 'acc')} | {cell(entry, 'acc_norm')} | {entry['n']} |")
    return "\n".join(lines)


def evaluate(
    model: str = DEFAULT_TEACHER,
    tasks: Sequence[str] = TASKS,
    data_dir: str | None = None,
    limit: int | float | None = None,
    batch_size: int = 16,
    mmlu_per_subject: int | None = None,
    builtin: bool = False,
    output: str | None = None,
    device: str = "auto",
    dtype: DtypeName = "auto",
    cache_dir: str | None = None,
) -> dict:
    """Evaluate ``model`` zero-shot on ``tasks`` and print the table.

    Args:
        model: teacher alias/directory/.gguf/hub id, or an exported student directory.
        tasks: task names (default: all seven: piqa, logiqa, arc_easy, arc_challenge, winogrande, wsc273, mmlu).
        data_dir: folder in the task data layout (docs/usage.md; default: ``$LIT_DOF_DATA``).
        limit: examples per task (int) or fraction of each task (float); default: full sets.
        batch_size: loglikelihood requests per forward.
        mmlu_per_subject: first this-many MMLU questions per subject (fixed stratified subset; 18 → 1026).
        builtin: use lm-eval's built-in tasks of the same names (downloads from the hub; online only).
        output: JSON file for the results and their provenance.
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``auto`` (the model's own: float32 for a teacher, the recorded dtype for a student), ``float32``,
            ``bfloat16`` or ``float16``.
        cache_dir: folder that keeps every answered request (lm-eval's request cache, bound to this model's
            weights and batch size): the same command started again after a kill resumes where it stopped.

    Returns:
        the results (``tasks`` and ``provenance``, as written to ``output``).

    Raises:
        DeviceError: an unknown ``device``/``dtype``, or CUDA where there is none (before the model loads).
        ImportError: lm-eval is not installed (``pip install 'lit-dof[eval]'``; before the model loads).
        ValueError: ``cache_dir`` holds another model's answers (before any request runs).
    """
    from lit_dof.evaluation.extra import require_lm_eval
    from lit_dof.evaluation.harness import evaluate_model
    from lit_dof.io import atomic_write_json

    require_lm_eval("lit-dof eval")
    where, parameters = resolve_device(device), resolve_model_dtype(dtype)
    loaded, tokenizer = load_model(model, device=where, dtype=parameters)
    results = evaluate_model(loaded, tokenizer, tasks, data_dir=data_dir, limit=limit, batch_size=batch_size,
                             mmlu_per_subject=mmlu_per_subject, builtin=builtin,
                             cache_dir=cache_dir)  # fmt: skip  # packed args
    results["provenance"]["model"] = model
    results["provenance"]["dtype"] = str(next(loaded.parameters()).dtype).removeprefix("torch.")
    results["provenance"]["data_dir"] = str(data_dir or os.environ.get("LIT_DOF_DATA"))
    print(format_table(results))
    print(f"wall time {results['provenance']['seconds']:.1f} s")
    if output:
        atomic_write_json(output, results)
    return results


def main(args: list[str] | None = None) -> None:
    """Entry of ``lit-dof eval`` (jsonargparse CLI over :func:`evaluate`).

    Args:
        args: the arguments after ``eval`` (default: the process's).

    Raises:
        SystemExit: ``--help``, or a usage error (a bad ``--device``/``--dtype`` too: message on stderr, code 2).
    """
    from jsonargparse import auto_cli

    with device_errors_exit("lit-dof eval"):
        auto_cli(evaluate, args=args, as_positional=False, prog="lit-dof eval")
