"""Diagnostic: how much attention mass a sliding-window + linear student puts on keys beyond its window, against
the teacher's, by query position — at contexts longer than the student was trained on.

For one block of ``--context`` held-out tokens the teacher's post-RoPE queries and keys are captured (the student
in teacher mode: the projections are shared) and, for ``--queries`` query positions per bucket, every layer and
query head:

* teacher far share: softmax mass on the far keys (sinks ≤ j ≤ i − w) — exact;
* student far share: e^β Σ_far K̂(q, k) / (Σ_exact exp(qᵀk/√d) + e^β Σ_far K̂(q, k)), the far term's share of the
  student's normaliser (its feature map, α and β as trained);
* log(student far sum / teacher far sum) = log(e^β Σ_far K̂ / Σ_far K): > 0 where the far term overestimates the
  kernel mass of the far keys.

Prints one line per position bucket (mean over layers and heads, and over the sampled queries) and, with
``--per-layer``, the last bucket per layer. Float64 throughout.

Usage: python tools/far_mass.py STUDENT_DIR --corpus FILE [--context 8192] [--queries 16] [--per-layer]
"""

from __future__ import annotations

import argparse
import itertools

import torch

from lit_dof.evaluation.perplexity import heldout_documents, text_tokens
from lit_dof.students import load_student
from lit_dof.teacher.capture import capture_attention


def _buckets(context: int, first: int) -> list[tuple[int, int]]:
    """Query-position buckets from ``first`` (= window + sinks: the first position with a far key) to ``context``."""
    edges = [first] + [e for e in (256, 512, 2048, 4096, 8192, 16384, 32768) if first < e < context] + [context]
    return list(itertools.pairwise(edges))


def _layer_masses(twin, q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, rotary=None) -> dict[str, torch.Tensor]:
    """Per (query head, sampled row): teacher far share, student far share, log far-sum ratio. q ``(1, Hq, T, d)``;
    ``rotary``: the capture's cos/sin, for a far term on un-rotated q/k."""
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
    log_k = torch.where((j >= s)[None, :, None], log_k, neg)
    prefix = log_k.logcumsumexp(1)  # (Hq, T, M): log Σ_{s ≤ j ≤ t} φ_m(k_j)
    last = (rows - w).clamp(min=0)
    log_far_s = (log_q[0].double() + prefix[:, last]).logsumexp(-1)  # (Hq, n)
    if twin.log_mix is not None:
        log_far_s = log_far_s + twin.log_mix.double()[:, None]
    log_far_s = torch.where((rows >= w + s)[None, :], log_far_s, neg)
    student_share = (log_far_s - torch.logaddexp(log_exact, log_far_s)).exp()
    return {"teacher": (log_far_t - log_all_t).exp(), "student": student_share, "log_ratio": log_far_s - log_far_t}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--queries", type=int, default=16, help="sampled query positions per bucket")
    parser.add_argument("--block", type=int, default=0, help="which block of the held-out stream")
    parser.add_argument("--per-layer", action="store_true")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    student, tokenizer = load_student(args.student), AutoTokenizer.from_pretrained(args.student)
    student.eval()
    twins = {i: m for i, m in student.linear_modules().items() if getattr(m, "far_term", False)}
    if not twins:
        parser.error(f"{args.student} has no sliding-window layer with a far term")
    window = next(iter(twins.values())).window
    tokens = text_tokens(heldout_documents(args.corpus), tokenizer, (args.block + 1) * args.context)
    if tokens.numel() < (args.block + 1) * args.context:
        parser.error(
            f"the held-out stream has {tokens.numel()} tokens, fewer than block {args.block} of {args.context}"
        )
    ids = tokens[args.block * args.context : (args.block + 1) * args.context][None]
    generator = torch.Generator().manual_seed(0)
    buckets = _buckets(args.context, window + next(iter(twins.values())).sink_tokens)
    rows = torch.cat([torch.randint(a, b, (args.queries,), generator=generator) for a, b in buckets])
    results: dict[int, dict] = {}

    def record(index, c):
        if index in twins:
            results[index] = _layer_masses(twins[index], c.q, c.k, rows, c.rotary)

    with torch.no_grad(), student.teacher_mode(), capture_attention(student.model, record):
        student(ids, use_cache=False)
    print(
        f"{args.student}: context {args.context}, window {window}, {len(twins)} layers, "
        f"{args.queries} queries per bucket"
    )
    print(f"{'positions':>12} | teacher far share | student far share | log(student far / teacher far)")
    for b, (lo, hi) in enumerate(buckets):
        part = slice(b * args.queries, (b + 1) * args.queries)
        values = {
            key: torch.stack([r[key][:, part] for r in results.values()]) for key in ("teacher", "student", "log_ratio")
        }
        ratio = values["log_ratio"][values["log_ratio"].isfinite()]
        print(
            f"{lo:>5}-{hi - 1:<6} | {values['teacher'].mean():17.3f} | {values['student'].mean():17.3f} | "
            f"{ratio.mean():+.2f} (median {ratio.median():+.2f})"
        )
    if args.per_layer:
        part = slice((len(buckets) - 1) * args.queries, len(buckets) * args.queries)
        print(
            f"per layer, positions {buckets[-1][0]}-{buckets[-1][1] - 1}: "
            "layer, teacher share, student share, log ratio"
        )
        for index, r in sorted(results.items()):
            ratio = r["log_ratio"][:, part]
            print(
                f"  {index:2d}  {r['teacher'][:, part].mean():.3f}  {r['student'][:, part].mean():.3f}  "
                f"{ratio[ratio.isfinite()].mean():+.2f}"
            )


if __name__ == "__main__":
    main()
