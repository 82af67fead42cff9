"""Zero-shot evaluation of a teacher or a student through lm-eval (paper §5, Table 3's seven tasks).

:func:`evaluate_model` wraps an *already loaded* model in lm-eval's ``HFLM`` (its loglikelihood batches bounded by
their logits' bytes: :mod:`~lit_dof.evaluation.batching`) and runs
``lm_eval.simple_evaluate`` on the task definitions shipped in ``lm_eval_tasks/`` (one YAML per task,
``lit_dof_<task>``, reading the original files of a local data directory through
:mod:`lit_dof.evaluation.task_data`), with ``TaskManager(include_defaults=False)`` so start-up does not
index lm-eval's thousands of built-in tasks. ``builtin=True`` runs lm-eval's own task names instead (they
download their datasets from the hub: online use only).

The result records what produced each number: lm-eval / transformers / torch versions, the model source,
the tasks, ``limit``, the batch size and the wall time.

With ``cache_dir``, every answered request is kept in lm-eval's own request cache (``use_cache``: a SQLite
file written as requests are answered), so an evaluation that is killed and started again resumes where it
stopped. lm-eval keys that cache by request only, so :func:`~lit_dof.evaluation.request_cache.request_cache` binds
the folder to one model (a hash of its weights), one batch size and one logits bound, refuses any other, and refuses
a cache file holding anything but plain answers before lm-eval unpickles it.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Sequence

import torch

from lit_dof.devices import device_label  # also importable from here, as before
from lit_dof.evaluation.extra import require_lm_eval
from lit_dof.evaluation.request_cache import request_cache, weights_digest  # noqa: F401  (also importable here)
from lit_dof.evaluation.retrieval import retrieval_cells
from lit_dof.evaluation.retrieval_data import RETRIEVAL_TASKS, RetrievalGrid
from lit_dof.evaluation.task_data import EXTRA_TASKS, TASKS
from lit_dof.io import library_versions

TASK_DIR = Path(__file__).with_name("lm_eval_tasks")
"""Folder of the shipped lm-eval task YAMLs (``lit_dof_<task>.yaml``)."""

METRICS = ("acc", "acc_norm", "exact_match", "recall", "perplexity")
"""The metrics a result records, where its task has them (retrieval: ``exact_match``/``recall`` of a generation,
``acc``/``perplexity`` of the answer's log-likelihood)."""

KNOWN_TASKS = (*TASKS, *EXTRA_TASKS, *RETRIEVAL_TASKS)
"""Every task name :func:`evaluate_model` accepts without ``builtin``."""


def task_manager(
    data_dir: str | os.PathLike | None = None,
    mmlu_per_subject: int | None = None,
    *,
    tokenizer: str | None = None,
    max_length: int | None = None,
    retrieval: RetrievalGrid | None = None,
):
    """An lm-eval ``TaskManager`` that knows only the shipped tasks; ``data_dir`` (default ``$LIT_DOF_DATA``),
    ``mmlu_per_subject`` and, for the retrieval tasks, the tokenizer's name or folder, the model's ``max_length``
    and the retrieval grid reach the loaders as task metadata.

    Raises:
        ImportError: lm-eval is not installed (the ``eval`` extra).
    """
    require_lm_eval("lit-dof's lm-eval tasks")
    from lm_eval.tasks import TaskManager

    metadata = {"data_dir": str(data_dir) if data_dir else os.environ.get("LIT_DOF_DATA")}
    if mmlu_per_subject:
        metadata["mmlu_per_subject"] = int(mmlu_per_subject)
    if tokenizer:
        metadata["tokenizer"] = str(tokenizer)
    if max_length:
        metadata["max_length"] = int(max_length)
    metadata.update((retrieval or RetrievalGrid()).metadata())
    return TaskManager(include_path=str(TASK_DIR), include_defaults=False, metadata=metadata)


def evaluate_model(
    model: torch.nn.Module,
    tokenizer,
    tasks: Sequence[str] = TASKS,
    *,
    data_dir: str | os.PathLike | None = None,
    limit: int | float | None = None,
    batch_size: int = 16,
    mmlu_per_subject: int | None = None,
    builtin: bool = False,
    max_length: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    retrieval: RetrievalGrid | None = None,
    max_logits_bytes: int | None = None,
) -> dict:
    """Zero-shot accuracy of ``model`` on ``tasks``.

    Args:
        model: a loaded causal LM (teacher or :class:`~lit_dof.students.LitDofForCausalLM`), on its device.
        tokenizer: its tokenizer (its ``name_or_path`` also sizes the retrieval prompts).
        tasks: names from :data:`KNOWN_TASKS` — the seven zero-shot tasks and the retrieval tasks
            (:data:`~lit_dof.evaluation.retrieval_data.RETRIEVAL_TASKS`) — or lm-eval names with ``builtin``.
        data_dir: folder in the task data layout (docs/usage.md; default ``$LIT_DOF_DATA``).
        limit: examples per task (int) or fraction (float); ``None``: full sets.
        batch_size: the most loglikelihood requests per forward (fewer where they would exceed ``max_logits_bytes``).
        mmlu_per_subject: first this-many MMLU questions per subject (a fixed stratified subset).
        builtin: use lm-eval's built-in task names (hub datasets, needs internet).
        max_length: longest context in tokens (default: the model config's ``max_position_embeddings``).
        cache_dir: folder of the request cache (:func:`request_cache`): answered requests are read back from it
            instead of recomputed, so a killed evaluation resumes; ``None``: no cache.
        retrieval: where the retrieval examples sit (contexts, depths, trials, seed); default
            :class:`~lit_dof.evaluation.retrieval_data.RetrievalGrid` ``()``.
        max_logits_bytes: the most bytes of one forward's float32 logits (``None``: 2 GiB,
            :data:`~lit_dof.evaluation.batching.DEFAULT_LOGITS_BYTES`): each task's batch is sized from its longest
            request (:class:`~lit_dof.evaluation.batching.BoundedBatchLM`), so long prompts cannot exhaust memory.

    Returns:
        ``{"tasks": {task: {"acc", "acc_stderr", "acc_norm"?, "acc_norm_stderr"?, "n", "items"}}, "provenance":
        {...}}``; ``items[metric]`` is the per-example score (0/1) in document order, for paired comparisons
        of two models on the same examples; ``tokens`` each example's longest request in tokens (context +
        continuation: :func:`~lit_dof.evaluation.retrieval.beyond_exact_share`). A retrieval task adds
        ``examples`` (each item's context, depth, prompt and needle positions, answers and, scored by generation,
        the generated text) and ``cells`` (:func:`~lit_dof.evaluation.retrieval.retrieval_cells` of its main
        score).

    Raises:
        ValueError: an unknown task name, or a ``cache_dir`` written for another model or batch size (before
            any request runs); FileNotFoundError: a missing data file; ImportError: lm-eval is not
            installed (the ``eval`` extra).
    """
    lm_eval = require_lm_eval("zero-shot evaluation (lit-dof eval, compare)")
    from lit_dof.evaluation.batching import DEFAULT_LOGITS_BYTES, BoundedBatchLM

    if not builtin:
        unknown = sorted(set(tasks) - set(KNOWN_TASKS))
        if unknown:
            raise ValueError(
                f"unknown task(s) {unknown}; known: {', '.join(KNOWN_TASKS)} (or pass builtin=True for lm-eval's)"
            )
    names = list(tasks) if builtin else [f"lit_dof_{t}" for t in tasks]
    config = getattr(model.config, "text_config", None) or model.config
    max_length = max_length or getattr(config, "max_position_embeddings", None) or 2048
    max_logits_bytes = max_logits_bytes or DEFAULT_LOGITS_BYTES
    lm = BoundedBatchLM(
        pretrained=model,
        tokenizer=tokenizer,
        backend="causal",
        batch_size=batch_size,
        max_length=max_length,
        max_logits_bytes=max_logits_bytes,
    )
    manager = (
        None
        if builtin
        else task_manager(
            data_dir, mmlu_per_subject, tokenizer=tokenizer.name_or_path, max_length=max_length, retrieval=retrieval
        )
    )
    settings = dict(batch_size=batch_size, max_length=max_length, max_logits_bytes=max_logits_bytes)
    use_cache = request_cache(cache_dir, model, **settings) if cache_dir else None
    start = time.perf_counter()
    model.eval()
    with torch.no_grad():
        raw = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            task_manager=manager,
            limit=limit,
            num_fewshot=0,
            log_samples=True,
            use_cache=use_cache,
        )
    seconds = time.perf_counter() - start
    results = {}
    for task, name in zip(tasks, names):
        row = raw["results"][name]
        entry = {"n": int(raw.get("n-samples", {}).get(name, {}).get("effective", 0))}
        for metric in METRICS:
            if f"{metric},none" in row:
                entry[metric] = float(row[f"{metric},none"])
                stderr = row.get(f"{metric}_stderr,none")
                entry[f"{metric}_stderr"] = float(stderr) if isinstance(stderr, (int, float)) else None
        samples = sorted(raw.get("samples", {}).get(name, []), key=lambda sample: sample["doc_id"])
        entry["items"] = {  # a loglikelihood task's per-item "perplexity" is the answer's log-likelihood
            ("loglikelihood" if m == "perplexity" else m): [float(sample[m]) for sample in samples]
            for m in METRICS
            if samples and m in samples[0]
        }
        if task in RETRIEVAL_TASKS:
            entry.update(_retrieval_entry(samples, entry["items"]))
        else:  # how long each example is: whether a student's exact window holds it (beyond_exact_share)
            entry["tokens"] = [_example_tokens(tokenizer, sample["arguments"]) for sample in samples]
        results[task] = entry
    device = device_label(next(model.parameters()).device)
    info = provenance(
        tasks=list(tasks),
        limit=limit,
        batch_size=batch_size,
        batch_sizes_used=sorted(set(lm.batch_sizes_used)),
        max_logits_bytes=max_logits_bytes,
        mmlu_per_subject=mmlu_per_subject,
        seconds=seconds,
        device=device,
    )
    if any(task in RETRIEVAL_TASKS for task in tasks):
        info["retrieval"] = (retrieval or RetrievalGrid()).settings()
    return {"tasks": results, "provenance": info}


def _example_tokens(tokenizer, arguments) -> int:
    """An example's longest request in tokens: context + continuation, as lm-eval's ``HFLM`` encodes them."""
    return max(
        len(tokenizer(context + continuation, add_special_tokens=False)["input_ids"])
        for context, continuation in arguments
    )


EXAMPLE_FIELDS = ("context", "depth", "trial", "prompt_tokens", "needle_token", "answers")
"""What a retrieval result keeps of each example (not its prompt: the grid and seed re-create it)."""


def _retrieval_entry(samples: list[dict], items: dict[str, list[float]]) -> dict:
    """A retrieval task's ``examples`` and ``cells`` from lm-eval's logged samples (in document order)."""
    examples = []
    for sample in samples:
        example = {k: sample["doc"][k] for k in EXAMPLE_FIELDS}
        response = sample.get("filtered_resps", [None])[0]
        if isinstance(response, str):  # a generation (loglikelihood tasks log (logprob, is_greedy))
            example["generation"] = response
        examples.append(example)
    main = items.get("exact_match") or items.get("acc") or []
    return {"examples": examples, "cells": retrieval_cells(examples, main)}


def provenance(**extra) -> dict:
    """Versions and machine of a measurement, plus ``extra`` (wall time in seconds, settings)."""
    versions = library_versions(("lit-dof", "lm_eval", "transformers", "torch", "datasets", "lightning"))
    return {
        "versions": versions,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        **extra,
    }
