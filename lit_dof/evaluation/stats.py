"""Paired statistics shared by the comparison (per-example task scores) and perplexity (per-block NLL)."""

from __future__ import annotations

import math
from collections.abc import Sequence


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
