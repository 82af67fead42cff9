"""Markdown tables of perplexity by token position (the comparison's ``ppl`` stage, ``by_position``), at long
contexts (its ``long`` stage) and by in-document position in whole long documents (its ``long_documents`` stage),
with ratios paired over blocks or documents (:func:`paired_perplexity_ratio`).

Each model is a mapping with ``label``, ``reference`` (the label of the row it is paired with, or ``None``)
and the results: ``by_position`` (one ``position_perplexity`` result), ``long`` (context → result) and
``long_documents`` (one :func:`~lit_dof.evaluation.long_documents.long_document_perplexity` result).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lit_dof.evaluation.position_perplexity import paired_perplexity_ratio


def _ratio_text(result: Mapping, reference: Mapping | None, bucket: str | None) -> str:
    """``r ± SE`` (SE of the ratio by the delta method: r · SE(log r)); ``–`` without a usable pair."""
    if reference is None:
        return "–"
    try:
        paired = paired_perplexity_ratio(result, reference, bucket)
    except (ValueError, KeyError):
        return "–"  # older records without per-block NLL, or other blocks
    return f"{paired['ratio']:.3f} ± {paired['ratio'] * paired['stderr_log']:.3f}"


def _ppl_text(bucket: Mapping | None) -> str:
    if bucket is None or bucket.get("ppl") is None:  # another setting's buckets, or one no document reaches
        return "–"
    return f"{bucket['ppl']:.2f}"


def _table(models: Sequence[Mapping], results: Mapping[str, Mapping], teacher: str | None) -> list[str]:
    """One row per model with a result: ppl per bucket, then ratios to the teacher and to the row's reference."""
    shown = [m for m in models if m["label"] in results]
    if not shown:
        return []
    buckets = list(results[shown[0]["label"]]["buckets"])
    columns = [
        "model",
        "ppl",
        *buckets,
        "/ teacher",
        *(f"/ teacher {b}" for b in buckets[-1:]),
        "/ reference",
        *(f"/ reference {b}" for b in buckets[-1:]),
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    by_label = {m["label"]: m for m in shown}
    for m in shown:
        result = results[m["label"]]
        base = results.get(teacher) if teacher and m["label"] != teacher else None
        reference = results.get(m.get("reference")) if m.get("reference") in by_label else None
        last = buckets[-1]
        cells = [
            m["label"],
            f"{result['ppl']:.2f}",
            *(_ppl_text(result["buckets"].get(b)) for b in buckets),
            _ratio_text(result, base, None),
            _ratio_text(result, base, last),
            f"{_ratio_text(result, reference, None)} ({m['reference']})" if reference else "–",
            _ratio_text(result, reference, last),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def position_lines(models: Sequence[Mapping], teacher: str | None) -> list[str]:
    """The "Perplexity by position" section of a comparison report (empty when no model has ``by_position``)."""
    results = {m["label"]: m["by_position"] for m in models if m.get("by_position")}
    table = _table(models, results, teacher)
    if not table:
        return []
    first = next(iter(results.values()))
    blocks = f"{first['blocks']} disjoint block{'s' * (first['blocks'] != 1)} of {first['block']} held-out tokens"
    title = (
        f"Perplexity by token position ({blocks}, each scored from its own first token; ratios: exp of the mean "
        "per-block NLL difference ± its standard error over blocks, paired on the same blocks):"
    )
    return ["", title, "", *table]


def long_context_lines(models: Sequence[Mapping], teacher: str | None) -> list[str]:
    """The "Long context" section: one position table per context length of the ``long`` stage."""
    contexts = sorted({int(c) for m in models for c in (m.get("long") or {})})
    lines: list[str] = []
    for context in contexts:
        results = {m["label"]: m["long"][str(context)] for m in models if str(context) in (m.get("long") or {})}
        table = _table(models, results, teacher)
        if table:
            blocks = next(iter(results.values()))["blocks"]
            lines += ["", f"Context {context} tokens ({blocks} block{'s' if blocks != 1 else ''}):", "", *table]
    title = "Long context (the `long` stage: perplexity by position in blocks of concatenated held-out documents):"
    return ["", title, *lines] if lines else []


def long_document_lines(models: Sequence[Mapping], teacher: str | None) -> list[str]:
    """The "Long documents" section (empty when no model has ``long_documents``)."""
    results = {m["label"]: m["long_documents"] for m in models if m.get("long_documents")}
    table = _table(models, results, teacher)
    if not table:
        return []
    first = next(iter(results.values()))
    title = (
        f"Long documents ({first['documents']} whole documents of the {first.get('split', 'long')} set, each scored "
        f"from its first token up to {first['max_tokens']} tokens; perplexity by in-document position; ratios: exp "
        "of the mean per-document NLL difference ± its standard error over documents, paired on the same documents):"
    )
    return ["", title, "", *table]
