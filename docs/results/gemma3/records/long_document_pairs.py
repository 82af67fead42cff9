"""The Gemma 3 long-document tables (docs/results/gemma3 README): seed 0's student against the teacher, (a) and (b)
on the 12 documents, by in-document bucket, from the committed records.

    python docs/results/gemma3/records/long_document_pairs.py

Ratios: exp of the mean per-document NLL difference ± its SE over the documents (paired); gap closed: the share of
(a)'s log-perplexity gap to the teacher that a model closes.
"""

import json
import math
from pathlib import Path

from lit_dof.evaluation.position_perplexity import bucket_ratios

HERE = Path(__file__).parent
teacher, a, b, student = (
    json.loads((HERE / f"{name}_long_documents.json").read_text())
    for name in ("teacher", "window_sinks", "equal_state", "seed0")
)


def closed(model: dict, bucket: str) -> float:
    """The share of (a)'s log-gap to the teacher in ``bucket`` that ``model`` closes."""
    s, w, t = (math.log(r["buckets"][bucket]["ppl"]) for r in (model, a, teacher))
    return (w - s) / (w - t)


vs_a, vs_b = bucket_ratios(student, a), bucket_ratios(student, b)
for bucket in ("64-511", "512-2047", "2048-4095", "4096-8191"):
    ppl = [r["buckets"][bucket]["ppl"] for r in (teacher, a, b, student)]
    print(
        f"{bucket:>9}: teacher {ppl[0]:.2f} (a) {ppl[1]:.2f} (b) {ppl[2]:.2f} student {ppl[3]:.2f} | "
        f"student/(a) {vs_a[bucket]['ratio']:.3f} ± {vs_a[bucket]['stderr']:.3f} | "
        f"student/(b) {vs_b[bucket]['ratio']:.3f} ± {vs_b[bucket]['stderr']:.3f} "
        f"({vs_b[bucket]['log_ratio'] / vs_b[bucket]['stderr_log']:+.1f} SE) | "
        f"gap closed: student {closed(student, bucket):.0%}, (b) {closed(b, bucket):.0%}"
    )
