"""Scoring and reporting the retrieval tasks (:mod:`lit_dof.evaluation.retrieval_data`).

* :func:`score_generation` — a greedy generation against the expected values: ``exact_match`` (every value
  found) and ``recall`` (the share found), RULER's "string match all" / "string match part" (Hsieh et al. 2024,
  §3) with digit boundaries (a pass key ``68432`` is not found in ``684321``).
* :func:`retrieval_cells` — per-item scores grouped by (context, depth), and by whether the queried needle lay
  beyond a model's exact positions (:func:`beyond_exact`); :func:`format_cells` prints them, :func:`heatmap`
  draws the context × depth map as a PNG.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from typing import Iterable, Sequence


def found(answer: str, text: str) -> bool:
    """Whether ``answer`` occurs in ``text``: case-insensitive, and a numeric answer not inside a longer number.

    Args:
        answer: one expected value.
        text: the generated text.

    Returns:
        True when found.
    """
    pattern = re.escape(answer.strip())
    if answer.strip().isdigit():
        pattern = rf"(?<!\d){pattern}(?!\d)"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def score_generation(answers: Sequence[str], text: str) -> dict[str, float]:
    """Score one generation.

    Args:
        answers: every value the answer must contain.
        text: the generated continuation of the prompt.

    Returns:
        ``{"exact_match": 1.0 if every value is found else 0.0, "recall": share of the values found}``.

    Raises:
        ValueError: no expected value.
    """
    if not answers:
        raise ValueError("a retrieval example needs at least one expected value")
    hits = [found(a, text) for a in answers]
    return {"exact_match": float(all(hits)), "recall": sum(hits) / len(hits)}


def beyond_exact(doc: dict, window: int, sink_tokens: int = 0) -> bool:
    """Whether the queried needle of ``doc`` lies outside the exact positions of a model whose softmax sees only
    the last ``window`` tokens and the first ``sink_tokens``, when it starts answering.

    Args:
        doc: a retrieval example record (``prompt_tokens``, ``needle_token``).
        window: w, tokens attended exactly (the query's own included); ``0``: none.
        sink_tokens: s, first tokens attended exactly.

    Returns:
        True when the needle starts before the window (``prompt_tokens − needle_token ≥ w``) and after the sinks.
    """
    return doc["prompt_tokens"] - doc["needle_token"] >= window and doc["needle_token"] >= sink_tokens


def exact_positions(model) -> int | None:
    """How many positions a model attends exactly whatever the query: ``w + s`` for a sliding-window student (a
    sequence of at most w + s tokens is attended exactly everywhere), 0 for a pure linear one, ``None`` for a model
    with full softmax attention (a teacher, a ``tail_only`` control).

    Args:
        model: a loaded model.

    Returns:
        the count, or ``None``.
    """
    options = getattr(getattr(model, "config", None), "window_options", None)
    if options is None:
        return None
    return int(options.get("window", 0)) + int(options.get("sink_tokens", 0)) if options.get("window") else 0


def beyond_exact_share(tokens: Sequence[int], exact: int | None) -> float | None:
    """The share of examples (their longest request, in tokens) longer than ``exact`` positions: the examples on
    which a student can differ from its teacher at all (``None`` exact: none can).

    Args:
        tokens: per example, its longest request in tokens.
        exact: :func:`exact_positions` of the student.

    Returns:
        the share in [0, 1], or ``None`` without examples or without a limit.
    """
    if exact is None or not tokens:
        return None
    return sum(t > exact for t in tokens) / len(tokens)


def retrieval_cells(docs: Iterable[dict], scores: Iterable[float]) -> dict[str, dict[str, dict]]:
    """Per-item scores grouped by cell.

    Args:
        docs: the items' example records (``context``, ``depth``).
        scores: their scores (0/1 exact matches, or any per-item metric), in the same order.

    Returns:
        ``{context: {depth: {"n", "mean", "se"}}}`` with string keys (``"1024"``, ``"0.5"``), sorted; ``se`` is
        the binomial/sample standard error over the cell's items (0 for one item).
    """
    grouped: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for doc, score in zip(docs, scores, strict=True):
        grouped[int(doc["context"])][float(doc["depth"])].append(float(score))
    return {str(c): {f"{d:g}": _summary(grouped[c][d]) for d in sorted(grouped[c])} for c in sorted(grouped)}


def _summary(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return {"n": n, "mean": mean, "se": math.sqrt(var / n)}


def format_cells(cells: dict[str, dict[str, dict]], title: str) -> str:
    """A markdown table: one row per context, one column per depth, ``mean (n)`` in each cell.

    Args:
        cells: :func:`retrieval_cells`.
        title: the first column's header (the task).

    Returns:
        the table.
    """
    depths = sorted({d for row in cells.values() for d in row}, key=float)
    lines = [f"| {title} | " + " | ".join(f"depth {d}" for d in depths) + " |", "|---" * (len(depths) + 1) + "|"]
    for context, row in cells.items():
        values = [f"{row[d]['mean']:.2f} ({row[d]['n']})" if d in row else "–" for d in depths]
        lines.append(f"| {context} tokens | " + " | ".join(values) + " |")
    return "\n".join(lines)


def heatmap(cells: dict[str, dict[str, dict]], path: str | os.PathLike, title: str) -> None:
    """Draw the context × depth map of ``cells`` (mean score, 0–1) as a PNG, written atomically.

    Args:
        cells: :func:`retrieval_cells`.
        path: the PNG file.
        title: the figure's title (model and task).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_dof.io import atomic_file

    contexts = list(cells)
    depths = sorted({d for row in cells.values() for d in row}, key=float)
    grid = [[cells[c][d]["mean"] if d in cells[c] else math.nan for d in depths] for c in contexts]
    figure, axes = plt.subplots(figsize=(1.2 + 0.9 * len(depths), 1.0 + 0.6 * len(contexts)))
    image = axes.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if not math.isnan(value):
                axes.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    axes.set_xticks(range(len(depths)), [f"{float(d):.0%}" for d in depths])
    axes.set_yticks(range(len(contexts)), contexts)
    axes.set_xlabel("needle depth")
    axes.set_ylabel("context (tokens)")
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.05)
    figure.tight_layout()
    with atomic_file(path) as handle:
        figure.savefig(handle, format="png", dpi=100)
    plt.close(figure)
