"""Paired statistics shared by the comparison (per-example task scores) and perplexity (per-block NLL; per-document
NLL weighted by tokens)."""

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


def weighted_mean(values: Sequence[float | None], weights: Sequence[float]) -> tuple[float, float, int]:
    """A ratio of totals over examples, ``m = Σ wᵢ vᵢ / Σ wᵢ``, with its standard error over examples.

    E.g. total NLL / total tokens over documents (``vᵢ`` the mean NLL of document i, ``wᵢ`` its tokens): the
    examples, not the tokens, are the independent units, so the standard error is the ratio estimator's (delta
    method; the cluster-robust form), ``√(n / (n − 1) · Σ wᵢ² (vᵢ − m)²) / Σ wᵢ`` over the n examples with
    ``wᵢ > 0`` (those with ``wᵢ = 0`` carry no tokens; their ``vᵢ`` may be ``None``). With equal weights it is the
    plain mean with its sd / √n, as :func:`paired_difference`. Source: the variance of a ratio estimate, Cochran,
    *Sampling Techniques* (3rd ed., 1977), ch. 6.

    Args:
        values: per-example means (``None`` allowed where the weight is 0).
        weights: per-example weights ≥ 0 (token counts), in the same order.

    Returns:
        ``(m, standard error of m, n)``.

    Raises:
        ValueError: different lengths, a negative weight, or fewer than two examples with a weight > 0.
    """
    if len(values) != len(weights) or any(w < 0 for w in weights):
        raise ValueError(f"need one weight ≥ 0 per value: got {len(values)} values and weights {list(weights)[:8]}…")
    kept = [(v, w) for v, w in zip(values, weights) if w > 0]
    if len(kept) < 2:
        raise ValueError(f"a standard error over examples needs ≥ 2 examples with weight > 0, got {len(kept)}")
    total = sum(w for _, w in kept)
    mean = sum(v * w for v, w in kept) / total
    n = len(kept)
    return mean, math.sqrt(n / (n - 1) * sum(w * w * (v - mean) ** 2 for v, w in kept)) / total, n


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


T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
"""Student's t quantile t₀.₉₇₅ for 1–30 degrees of freedom (any statistics table; 1.96 beyond): the half-width of a
95% interval is ``T_975[n − 2] · SE`` over n runs."""


def paired_seed_difference(a: Mapping[int, float], b: Mapping[int, float], *, log: bool = False) -> dict:
    """Two recipes compared over independent fits paired by seed (the runs are the unit, not blocks or examples).

    Args:
        a: per seed, one recipe's measure (e.g. held-out perplexity, an average task score).
        b: per seed, the other recipe's, fitted with the same seed (initialisation and data order).
        log: compare ``log a − log b`` (for ratios such as perplexities: ``exp`` of the mean is the geometric-mean
            ratio) instead of ``a − b``.

    Returns:
        ``{"difference", "stderr", "n", "seeds", "ci95": (low, high), "ratio"?}`` over the seeds both have:
        mean paired difference, its standard error (sample sd / √n), the 95% t interval; with ``log``, ``ratio``
        is ``exp(difference)`` and the interval is on the log scale.

    Raises:
        ValueError: fewer than two seeds in common (a single fit has no spread over runs).
    """
    seeds = sorted(a.keys() & b.keys())
    if len(seeds) < 2:
        raise ValueError(f"a comparison over runs needs >= 2 seeds in common, got {seeds}; fit more seeds")
    if log:
        values = [(math.log(a[s]), math.log(b[s])) for s in seeds]
    else:
        values = [(a[s], b[s]) for s in seeds]
    mean, stderr, n = paired_difference([x for x, _ in values], [y for _, y in values])
    half = (T_975[n - 2] if n - 2 < len(T_975) else 1.96) * stderr
    result = {"difference": mean, "stderr": stderr, "n": n, "seeds": seeds, "ci95": (mean - half, mean + half)}
    if log:
        result["ratio"] = math.exp(mean)
    return result
