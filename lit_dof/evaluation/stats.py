"""Paired statistics shared by the comparison (per-example task scores) and perplexity (per-block NLL)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, int]:
    """Mean per-example difference of two models scored on the *same* examples, with its standard error.

    Pairing removes the between-example variance that the two unpaired standard errors both carry, so a
    difference of 2 points that is ~1.6 unpaired SEs can be several paired SEs (the paired t / McNemar view).

    Args:
        a: per-example scores (e.g. 0/1 correctness), length n.
        b: the other model's scores, in the same example order.

    Returns:
        ``(mean(a − b), sd(a − b) / √n, n)`` (sample standard deviation, n − 1).

    Raises:
        ValueError: different lengths, or fewer than two examples.
    """
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired scores need the same examples (≥ 2): got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    mean = sum(diffs) / len(diffs)
    variance = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean, math.sqrt(variance / len(diffs)), len(diffs)


def paired_task_differences(
    items: Mapping[str, Sequence[float]], reference: Mapping[str, Sequence[float]], tasks: Sequence[str]
) -> tuple[dict[str, dict], dict | None]:
    """Per-task paired differences of two models and their average over ``tasks``.

    Tasks are disjoint example sets, so the average's standard error is √(Σ SE²) / n over the n tasks.

    Args:
        items: per task, one model's per-example scores.
        reference: per task, the other model's scores on the same examples in the same order.
        tasks: the tasks the average runs over.

    Returns:
        ``(per_task, average)``: ``per_task[task] = {"difference", "stderr", "n"}`` (:func:`paired_difference`)
        for every task of ``reference`` that ``items`` scored on as many examples; ``average = {"difference",
        "stderr"}`` when every one of ``tasks`` is paired, else ``None``.
    """
    per_task = {
        task: dict(zip(("difference", "stderr", "n"), paired_difference(items[task], values)))
        for task, values in reference.items()
        if len(items.get(task, ())) == len(values)
    }
    if not tasks or any(task not in per_task for task in tasks):
        return per_task, None
    paired = [per_task[task] for task in tasks]
    average = {
        "difference": sum(d["difference"] for d in paired) / len(paired),
        "stderr": math.sqrt(sum(d["stderr"] ** 2 for d in paired)) / len(paired),
    }
    return per_task, average
