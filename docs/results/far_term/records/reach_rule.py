"""The rule of "A far term that reaches further" (docs/results/far_term README), applied: quickstart_heads_reach
against quickstart_heads (seed 0, refitted) on the long choosing set (long_choice.py's record) and on validation.

    python docs/results/far_term/records/reach_rule.py [OUT [LONG_CHOICE_JSON]]

OUT (default runs/far_term) holds the compare cells; without them, the copies committed beside this script
(``<row>_{fit,ppl,recall}.json``); LONG_CHOICE_JSON defaults to records/long_choice.json.
"""

import json
import math
import statistics as st
import sys
from pathlib import Path

from lit_dof.evaluation.position_perplexity import bucket_ratios

HERE = Path(__file__).parent
R = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/far_term") / "C64"
LONG = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "long_choice.json"
ROW, BASE = "quickstart_heads_reach", "quickstart_heads"


def load(p):  # noqa: D103
    return json.loads(p.read_text()) if p.exists() else None


def cell(row, name):  # noqa: D103  a cell's record, else the committed copy
    path = R / row / ("retrieval/recall.json" if name == "recall" else f"{name}.json")
    return load(path) or load(HERE / f"{row}_{name}.json")


def paired(a, b):  # noqa: D103  mean and SE of the per-block NLL difference
    d = [x - y for x, y in zip(a, b)]
    return st.mean(d), st.stdev(d) / math.sqrt(len(d))


long = load(LONG)
ratios = bucket_ratios(long[ROW]["student"], long[BASE]["student"])
ratio = ratios["2048-4095"]
print(f"long choosing set ({long['articles']} articles), {ROW} / {BASE}:")
for bucket, r in ratios.items():
    print(f"  {bucket:>9}: {r['ratio']:.3f} ± {r['stderr']:.3f} ({r['log_ratio'] / r['stderr_log']:+.1f} SE)")
for name in (BASE, ROW):
    closed = long[name]["closed"]
    print(f"  {name}: (a)-teacher gap closed " + ", ".join(f"{b} {v:.0%}" for b, v in closed.items() if v is not None))
long_win = ratio["log_ratio"] < -2 * ratio["stderr_log"]

ppl, base_ppl, committed = cell(ROW, "ppl"), cell(BASE, "ppl"), load(HERE / f"{BASE}_ppl.json")
for p in (ppl, base_ppl):
    assert p["split"] == "validation" and p["tokens"] == committed["tokens"], "not the rule's blocks"
drift = max(abs(x - y) for x, y in zip(base_ppl["by_position"]["block_nll"], committed["by_position"]["block_nll"]))
print(
    f"{BASE} refitted: validation ppl {base_ppl['ppl']:.3f} (committed {committed['ppl']:.3f};"
    f" blocks within {drift:.1e} nats)"
)
mean, se = paired(ppl["by_position"]["block_nll"], base_ppl["by_position"]["block_nll"])
print(f"{ROW}: validation ppl {ppl['ppl']:.2f}, paired log ratio {mean:+.4f} ± {se:.4f} (ratio {math.exp(mean):.3f})")
for bucket, r in bucket_ratios(ppl["by_position"], base_ppl["by_position"]).items():
    print(f"  {bucket:>9}: {r['ratio']:.3f} ± {r['stderr']:.3f}")
valid_ok = mean <= 2 * se

recall = sum(cell(ROW, "recall")["items"]["exact_match"])
base_recall = sum(cell(BASE, "recall")["items"]["exact_match"])
fit, base_fit = cell(ROW, "fit"), cell(BASE, "fit")
print(
    f"recall {recall:.0f}/40 ({BASE} {base_recall:.0f}/40); fit {fit['wall_seconds'] / 60:.1f} min "
    f"({BASE} {base_fit['wall_seconds'] / 60:.1f}); Σ M {fit['total_features']:.0f} ({base_fit['total_features']:.0f})"
)
checks = {
    "2048-4095 below by > 2 SE": long_win,
    "validation not above by > 2 block SE": valid_ok,
    "recall >= 22/40": recall >= 22,
    "fit < 60 min": fit["wall_seconds"] < 3600,
}
print(
    "rule:",
    ", ".join(f"{k}: {v}" for k, v in checks.items()),
    "->",
    f"{ROW} replaces {BASE}" if all(checks.values()) else f"{BASE} stays",
)
