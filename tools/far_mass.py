"""Diagnostic: how much attention mass a sliding-window + linear student puts on keys beyond its window, against
the teacher's, by query position — at contexts longer than the student was trained on.

For one block of ``--context`` held-out tokens — or, with ``--long-articles N``, each of the last N long training
articles (:func:`~lit_dof.data.sources.last_long_documents`: no fit reads them) from its first token, so that positions
are in-document — the teacher's post-RoPE queries and keys are captured (the student in teacher mode: the projections
are shared) and, for ``--queries`` query positions per bucket, every layer and query head of the windowed KV heads
(a per-head layer's exact heads have no far term and are left out):

* teacher far share: softmax mass on the far keys (sinks ≤ j ≤ i − w) — exact;
* student far share: e^β Σ_far e^{−λ(i − w − j)} K̂(q, k_j) / (Σ_exact exp(qᵀk/√d) + the same far sum), the far
  term's share of the student's normaliser (its feature map, α, β and decay λ as trained; λ = 0 without a decay);
* log(student far sum / teacher far sum) = log(e^β Σ_far K̂ / Σ_far K): > 0 where the far term overestimates the
  kernel mass of the far keys.

Prints one line per position bucket (mean over layers, heads and the sampled queries; ± SE over the documents) and,
with ``--per-layer``, the last bucket per layer. Float64 throughout.

Usage: python tools/far_mass.py STUDENT_DIR --corpus FILE [--context 8192] [--queries 16] [--per-layer]
[--long-articles 12]
"""

from __future__ import annotations

import argparse
import itertools

import torch

from lit_dof.data.sources import last_long_documents
from lit_dof.evaluation.perplexity import heldout_documents, text_tokens
from lit_dof.evaluation.stats import weighted_mean
from lit_dof.students import load_student
from lit_dof.teacher.capture import capture_attention

MASSES = ("teacher", "student", "log_ratio")
"""What :func:`_twin_masses` returns per (query head, row): the two far shares and the log far-sum ratio."""


def _buckets(context: int, first: int) -> list[tuple[int, int]]:
    """Query-position buckets from ``first`` (= window + sinks: the first position with a far key) to ``context``."""
    edges = [first] + [e for e in (256, 512, 2048, 4096, 8192, 16384, 32768) if first < e < context] + [context]
    return list(itertools.pairwise(edges))


def _twin_masses(twin, q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, rotary=None) -> dict[str, torch.Tensor]:
    """Per (query head, sampled row) of one sliding-window twin: teacher far share, student far share, log far-sum
    ratio. q ``(1, Hq, T, d)``; ``rotary``: the capture's cos/sin, for a far term on un-rotated q/k. A decaying far
    term weighs far key j at query i by e^{−λ(i − w − j)} (its :meth:`decay_rates`; with one λ per feature, inside
    the sum over features)."""
    w, s = twin.window, twin.sink_tokens
    _, Hq, T, d = q.shape
    group = Hq // k.shape[1]
    keys = k.repeat_interleave(group, dim=1)[0].double()  # (Hq, T, d)
    qs = q[0, :, rows].double()  # (Hq, n, d)
    j = torch.arange(T)
    causal = j[None, :] <= rows[:, None]  # (n, T)
    far = (j[None, :] >= s) & (j[None, :] <= rows[:, None] - w)
    exact = causal & ~far
    logits = qs @ keys.transpose(-1, -2) / d**0.5  # (Hq, n, T)
    neg = torch.tensor(float("-inf"), dtype=torch.float64)
    log_far_t = torch.where(far, logits, neg).logsumexp(-1)
    log_exact = torch.where(exact, logits, neg).logsumexp(-1)
    log_all_t = torch.where(causal, logits, neg).logsumexp(-1)
    q_far, k_far = twin.far_inputs(q, k, rotary)  # the vectors the far term's maps see
    log_q, log_k = twin.exact_log_features(q_far[:, :, rows].float(), k_far.float())  # (1, Hq, n, M), (1, Hk|Hq, T, M)
    log_k = log_k[0].double()
    if log_k.shape[0] != Hq:
        log_k = log_k.repeat_interleave(group, dim=0)  # (Hq, T, M)
    rates = twin.decay_rates(per_query_head=True)
    rates = torch.zeros(Hq, 1, dtype=torch.float64) if rates is None else rates.detach().double()
    rates = rates if rates.dim() == 2 else rates[:, None]  # (Hq, M or 1): a decay per feature or per head
    log_k = log_k + rates[:, None, :] * j.double()[None, :, None]  # e^{λ j}: the decay, up to e^{−λ(i − w)} below
    log_k = torch.where((j >= s)[None, :, None], log_k, neg)
    prefix = log_k.logcumsumexp(1)  # (Hq, T, M): log Σ_{s ≤ j ≤ t} e^{λ_m j} φ_m(k_j)
    last = (rows - w).clamp(min=0)
    log_q = log_q[0].double() - rates[:, None, :] * (rows - w).double()[None, :, None]  # (Hq, n, M)
    log_far_s = (log_q + prefix[:, last]).logsumexp(-1)  # (Hq, n)
    if twin.log_mix is not None:
        log_far_s = log_far_s + twin.log_mix.detach().double()[:, None]
    log_far_s = torch.where((rows >= w + s)[None, :], log_far_s, neg)
    student_share = (log_far_s - torch.logaddexp(log_exact, log_far_s)).exp()
    return {"teacher": (log_far_t - log_all_t).exp(), "student": student_share, "log_ratio": log_far_s - log_far_t}


def _layer_masses(layer, q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, rotary=None) -> dict[str, torch.Tensor]:
    """:func:`_twin_masses` of a sliding-window twin, or of each windowed group of a per-head layer
    (:class:`~lit_dof.attention.layers.grouped.HeadGroupedAttention`), their query heads concatenated: its exact
    heads have no far term and are left out."""
    if not hasattr(layer, "split"):
        return _twin_masses(layer, q, k, rows, rotary)
    parts = [
        _twin_masses(twin, q_g, k_g, rows, rotary)
        for twin, q_g, k_g, _ in layer.split(q, k)
        if getattr(twin, "far_term", False)
    ]
    return {key: torch.cat([p[key] for p in parts]) for key in MASSES}


def _documents(args, tokenizer) -> list[torch.Tensor]:
    """The token blocks scored: one block of the held-out stream, or ``--long-articles`` long training articles no
    fit reads (:func:`~lit_dof.data.sources.last_long_documents`), each from its first token (in-document
    positions)."""
    if args.long_articles:
        texts, _, _ = last_long_documents(args.corpus, tokenizer, args.long_articles, min_tokens=args.context)
        return [
            tokenizer(t, add_special_tokens=False, return_tensors="pt")["input_ids"][:, : args.context] for t in texts
        ]
    tokens = text_tokens(heldout_documents(args.corpus), tokenizer, (args.block + 1) * args.context)
    if tokens.numel() < (args.block + 1) * args.context:
        raise SystemExit(
            f"the held-out stream has {tokens.numel()} tokens, fewer than block {args.block} of {args.context}"
        )
    return [tokens[args.block * args.context : (args.block + 1) * args.context][None]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--queries", type=int, default=16, help="sampled query positions per bucket")
    parser.add_argument("--block", type=int, default=0, help="which block of the held-out stream")
    parser.add_argument(
        "--long-articles", type=int, default=0, help="score this many long training articles instead (in-document)"
    )
    parser.add_argument("--per-layer", action="store_true")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    student, tokenizer = load_student(args.student), AutoTokenizer.from_pretrained(args.student)
    student.eval()
    twins = {i: m for i, m in student.linear_modules().items() if getattr(m, "far_term", False)}
    if not twins:
        parser.error(f"{args.student} has no sliding-window layer with a far term")
    window, sinks = _window_sinks(next(iter(twins.values())))
    buckets = _buckets(args.context, window + sinks)
    generator = torch.Generator().manual_seed(0)
    per_document = []  # per document: {key: (layers, heads, rows)}
    for ids in _documents(args, tokenizer):
        rows = torch.cat([torch.randint(a, b, (args.queries,), generator=generator) for a, b in buckets])
        results: dict[int, dict] = {}

        def record(index, c):
            if index in twins:
                results[index] = _layer_masses(twins[index], c.q, c.k, rows, c.rotary)

        with torch.no_grad(), student.teacher_mode(), capture_attention(student.model, record):
            student(ids, use_cache=False)
        per_document.append(results)
    source = f"{len(per_document)} long articles (in-document)" if args.long_articles else f"block {args.block}"
    print(
        f"{args.student}: {source}, context {args.context}, window {window} + {sinks} sinks, {len(twins)} layers "
        f"(windowed heads only), {args.queries} queries per bucket and document; ± SE over documents"
    )
    print(f"{'positions':>12} | teacher far share | student far share | log(student far / teacher far), mean (median)")
    for b, (lo, hi) in enumerate(buckets):
        part = slice(b * args.queries, (b + 1) * args.queries)
        stats = {key: [] for key in ("teacher", "student", "log_ratio", "median")}
        for results in per_document:  # per document: the mean over layers, heads and rows
            pooled = {key: torch.cat([r[key][:, part].flatten() for r in results.values()]) for key in MASSES}
            ratio = pooled["log_ratio"][pooled["log_ratio"].isfinite()]
            means = (pooled["teacher"].mean(), pooled["student"].mean(), ratio.mean(), ratio.median())
            for key, value in zip(stats, means):
                stats[key].append(float(value))
        print(
            f"{lo:>5}-{hi - 1:<6} | {_mean_se(stats['teacher']):>17} | {_mean_se(stats['student']):>17} | "
            f"{_mean_se(stats['log_ratio'], '+.2f')} (median {sum(stats['median']) / len(stats['median']):+.2f})"
        )
    if args.per_layer:
        part = slice((len(buckets) - 1) * args.queries, len(buckets) * args.queries)
        print(
            f"per layer, positions {buckets[-1][0]}-{buckets[-1][1] - 1}: "
            "layer, teacher share, student share, log ratio"
        )
        for index in sorted(twins):
            rs = [results[index] for results in per_document]
            share = lambda key: torch.cat([r[key][:, part].flatten() for r in rs])  # noqa: E731
            ratio = share("log_ratio")
            ratio = ratio[ratio.isfinite()].mean()
            print(f"  {index:2d}  {share('teacher').mean():.3f}  {share('student').mean():.3f}  {ratio:+.2f}")


def _window_sinks(layer) -> tuple[int, int]:
    """The window and sink tokens of a twin, or of a per-head layer's first windowed group."""
    twin = layer.twins[0] if hasattr(layer, "twins") else layer
    return twin.window, twin.sink_tokens


def _mean_se(values: list[float], spec: str = ".3f") -> str:
    """``mean ± SE`` over documents (:func:`~lit_dof.evaluation.stats.weighted_mean`, equal weights; the value alone
    for one document)."""
    if len(values) == 1:
        return format(values[0], spec)
    mean, se, _ = weighted_mean(values, [1.0] * len(values))
    return f"{format(mean, spec)} ± {se:.3f}"


if __name__ == "__main__":
    main()
