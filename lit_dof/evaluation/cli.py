"""``lit-dof eval``: zero-shot accuracy of a teacher or an exported student on the paper's tasks, offline.

    lit-dof eval --model smollm2-135m-instruct --tasks '[arc_easy, piqa]' --data_dir $LIT_DOF_DATA
    lit-dof eval --model runs/quickstart/version_0/student --limit 200 --output eval.json
    lit-dof eval --model smollm2-135m-instruct --device cuda:1 --dtype bfloat16
    lit-dof eval --model runs/quickstart/version_0/student --cache_dir eval_cache   # resumable
    lit-dof eval --model smollm2-135m-instruct --tasks '[passkey, niah_multikey]' --figures figures \
        --retrieval.contexts '[1024, 2048, 4096]' --retrieval.trials 4      # retrieval: context x depth

Prints a table (acc and acc_norm with standard errors, examples per task) and, with ``--output``, writes
the numbers and their provenance (versions, settings, wall time) as JSON, atomically. Retrieval tasks
(:data:`~lit_dof.evaluation.retrieval_data.RETRIEVAL_TASKS`: passkey, RULER-style needles, associative recall;
``<task>_ll`` scores the answer's log-likelihood) print a context × depth table each and, with ``--figures``,
draw it as ``<figures>/<task>.png``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from lit_dof.devices import device_errors_exit, resolve_device, resolve_model_dtype
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.retrieval import beyond_exact_share, exact_positions, format_cells, heatmap
from lit_dof.evaluation.retrieval_data import RetrievalGrid
from lit_dof.evaluation.task_data import TASKS, check_task_data
from lit_dof.precision import DtypeName
from lit_dof.teacher import DEFAULT_TEACHER

DATA_FIX = (
    "pass --data_dir DIR or set LIT_DOF_DATA to a folder in the task data layout (docs/usage.md, 'Task data "
    "layout'), or pass --builtin true for lm-eval's own tasks of the same names, downloaded from the hub"
)
"""How ``lit-dof eval`` says to give missing task data."""


def format_table(results: dict) -> str:
    """Markdown table of :func:`~lit_dof.evaluation.harness.evaluate_model` results."""

    def cell(entry, metric):
        if metric not in entry:
            return "–"
        stderr = entry.get(f"{metric}_stderr")
        return f"{entry[metric]:.4f} ± {stderr:.4f}" if stderr is not None else f"{entry[metric]:.4f}"

    exact = results["provenance"].get("exact_positions")
    beyond = f" beyond {exact} tokens |" if exact is not None else ""
    lines = [f"| task | acc | acc_norm | exact_match | n |{beyond}", "|---|---|---|---|---|" + "---|" * bool(beyond)]
    for task, entry in results["tasks"].items():
        scores = " | ".join(cell(entry, metric) for metric in ("acc", "acc_norm", "exact_match"))
        share = entry.get("beyond_exact")
        extra = (f" {share:.0%} |" if share is not None else " – |") if beyond else ""
        lines.append(f"| {task} | {scores} | {entry['n']} |{extra}")
    for task, entry in results["tasks"].items():
        if "cells" in entry:
            lines += ["", format_cells(entry["cells"], task)]
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
    retrieval: RetrievalGrid = RetrievalGrid(),
    figures: str | None = None,
    controls: bool = False,
) -> dict:
    """Evaluate ``model`` zero-shot on ``tasks`` and print the table.

    Args:
        model: teacher alias/directory/.gguf/hub id, or an exported student directory.
        tasks: task names (default: all seven: piqa, logiqa, arc_easy, arc_challenge, winogrande, wsc273, mmlu);
            retrieval tasks: passkey, niah_single, niah_uuid, niah_multikey, niah_multivalue, niah_multiquery,
            assoc_recall (greedy generation, exact match) and passkey_ll, niah_single_ll, niah_uuid_ll,
            niah_multikey_ll, assoc_recall_ll (the answer's log-likelihood).
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
        retrieval: where the retrieval examples sit: ``contexts`` (tokens, prompt + answer budget; those past the
            model's positions are dropped), ``depths`` (0–1), ``trials`` per cell, ``seed``. ``--limit`` k × cells
            keeps k trials of every cell.
        figures: folder for each retrieval task's context × depth heatmap (``<task>.png``; a control's in
            ``<figures>/<control>/``); ``None``: none.
        controls: a student is also evaluated beside its controls (lit_dof.evaluation.controls.control_models: the
            teacher behind the student's window + sinks, the teacher behind the window of equal decode state, the
            student's LoRA-merged weights with full attention where it has a tail, the student's far term alone
            where it has a window and a far term), on the same tasks and examples;
            each one's cache in ``<cache_dir>/<control>``.

    Returns:
        the results (``tasks`` and ``provenance``, as written to ``output``; a student's ``exact_positions`` and
        each task's ``beyond_exact``: the share of its examples longer than them, the only ones on which the
        student can differ from its teacher; with ``controls``, also
        ``controls: {name: {"control": what it is, "tasks", "provenance"}}``).

    Raises:
        DeviceError: an unknown ``device``/``dtype``, or CUDA where there is none (before the model loads).
        ImportError: lm-eval is not installed (``pip install 'lit-dof[eval]'``; before the model loads).
        TaskDataError: a task's data files are missing, or no data directory is set (without ``builtin``; before
            the model loads; the message names ``--data_dir``, ``LIT_DOF_DATA`` and ``--builtin``).
        ValueError: ``cache_dir`` holds another model's answers (before any request runs); ``controls`` for a
            model that is not a student.
    """
    from lit_dof.evaluation.extra import require_lm_eval
    from lit_dof.io import atomic_write_json

    require_lm_eval("lit-dof eval")
    where, parameters = resolve_device(device), resolve_model_dtype(dtype)
    if not builtin:
        check_task_data(tasks, data_dir, fix=DATA_FIX)
    loaded, tokenizer = load_model(model, device=where, dtype=parameters)
    settings = {
        "tasks": tasks,
        "data_dir": data_dir,
        "limit": limit,
        "batch_size": batch_size,
        "mmlu_per_subject": mmlu_per_subject,
        "builtin": builtin,
        "retrieval": retrieval,
    }
    others = {}
    if controls:
        from lit_dof.evaluation.controls import control_info, control_models
        from lit_dof.students.modeling import LitDofForCausalLM

        if not isinstance(loaded, LitDofForCausalLM):
            raise ValueError(f"--controls needs a lit-dof student; {model} is not one (evaluate it without --controls)")
        others = control_models(loaded)
    results = _evaluate_one(loaded, tokenizer, model, settings, cache_dir, figures)
    results["provenance"]["data_dir"] = str(data_dir or os.environ.get("LIT_DOF_DATA"))
    if others:
        results["controls"] = {}
    for name, control in others.items():
        print(f"\ncontrol {name}: {control_info(control).description}")
        where_cache, where_figures = (os.path.join(d, name) if d else None for d in (cache_dir, figures))
        entry = _evaluate_one(control, tokenizer, f"{model} [{name}]", settings, where_cache, where_figures)
        results["controls"][name] = {"control": control_info(control).to_dict(), **entry}
    if output:
        atomic_write_json(output, results)
    return results


def _evaluate_one(loaded, tokenizer, label: str, settings: dict, cache_dir: str | None, figures: str | None) -> dict:
    """Evaluate one loaded model, print its table (and wall time), draw its retrieval heatmaps."""
    from lit_dof.evaluation.harness import evaluate_model

    results = evaluate_model(
        loaded,
        tokenizer,
        settings["tasks"],
        data_dir=settings["data_dir"],
        limit=settings["limit"],
        batch_size=settings["batch_size"],
        mmlu_per_subject=settings["mmlu_per_subject"],
        builtin=settings["builtin"],
        cache_dir=cache_dir,
        retrieval=settings["retrieval"],
    )
    results["provenance"]["model"] = label
    results["provenance"]["dtype"] = str(next(loaded.parameters()).dtype).removeprefix("torch.")
    exact = results["provenance"]["exact_positions"] = exact_positions(loaded)
    for entry in results["tasks"].values():
        if "tokens" in entry:
            entry["beyond_exact"] = beyond_exact_share(entry["tokens"], exact)
    print(format_table(results))
    for task, entry in results["tasks"].items():
        if figures and "cells" in entry:
            heatmap(entry["cells"], os.path.join(figures, f"{task}.png"), title=f"{task}: {label}")
    print(f"wall time {results['provenance']['seconds']:.1f} s")
    return results


def main(args: list[str] | None = None) -> None:
    """Entry of ``lit-dof eval`` (jsonargparse CLI over :func:`evaluate`).

    Args:
        args: the arguments after ``eval`` (default: the process's).

    Raises:
        SystemExit: ``--help``, or a usage error (a bad ``--device``/``--dtype`` too: message on stderr, code 2).
    """
    from lit_dof.help_text import command_cli

    with device_errors_exit("lit-dof eval"):
        command_cli(evaluate, args, "lit-dof eval", as_positional=False)
