"""The rule of "A gate and window dropout on quickstart_heads" (docs/results/far_term README), applied: each
candidate's validation cells paired with quickstart_heads' committed records on the same 32 blocks and 40 recall
items.  python docs/results/far_term/records/gate_rule.py [OUT [ROW ...]]  (default runs/far_term and the two gate
rows; without their cells, the copies committed beside this script). The "Which heads" rule (quickstart_longrange)
is the same: python docs/results/far_term/records/gate_rule.py runs/far_term quickstart_longrange."""

import json
import math
import statistics as st
import sys
from pathlib import Path

R, HERE = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/far_term") / "C64", Path(__file__).parent


def load(p):  # noqa: D103
    return json.loads(p.read_text()) if p.exists() else None


def by_context(recall):  # noqa: D103  items recalled per context, e.g. {"2048": 19, "4096": 6}
    return {c: round(sum(v["mean"] * v["n"] for v in cells.values())) for c, cells in recall["cells"].items()}


base_ppl, base_recall = load(HERE / "quickstart_heads_ppl.json"), load(HERE / "quickstart_heads_recall.json")
base_items = base_recall["items"]["exact_match"]
print(
    f"quickstart_heads: ppl {base_ppl['ppl']:.2f}, recall {sum(base_items):.0f}/{len(base_items)}",
    by_context(base_recall),
)
found = {}
for row in sys.argv[2:] or ("quickstart_heads_gate", "quickstart_heads_gate_dropout"):
    ppl, recall = load(R / row / "ppl.json"), load(R / row / "retrieval" / "recall.json")
    if not ppl and not recall:
        ppl, recall = load(HERE / f"{row}_ppl.json"), load(HERE / f"{row}_recall.json")
    if not ppl or not recall:
        print(row, "not measured yet")
        continue
    assert ppl["split"] == "validation" and ppl["tokens"] == base_ppl["tokens"], "not the rule's blocks"
    d = [x - y for x, y in zip(ppl["by_position"]["block_nll"], base_ppl["by_position"]["block_nll"])]
    assert len(d) == 32
    se = st.stdev(d) / math.sqrt(len(d))
    items = recall["items"]["exact_match"]
    assert len(items) == len(base_items) == 40
    gained = sum(x > y for x, y in zip(items, base_items))
    lost = sum(x < y for x, y in zip(items, base_items))
    found[row] = (ppl["ppl"], st.mean(d), se, sum(items))
    print(
        f"{row}: ppl {ppl['ppl']:.2f}, paired block log-ratio {st.mean(d):+.4f} ± {se:.4f} "
        f"(ratio {math.exp(st.mean(d)):.3f}), recall {sum(items):.0f}/40 {by_context(recall)}",
        f"(+{gained} −{lost} paired)",
    )
if found:
    row, (ppl, mean, se, recall) = min(found.items(), key=lambda kv: kv[1][0])
    wins = mean < -2 * se and recall >= 22
    print(
        f"rule: the lower perplexity is {row}'s; below quickstart_heads' by > 2 block SEs: {mean < -2 * se}; "
        f"recall ≥ 22/40: {recall >= 22} -> {'replaces quickstart_heads' if wins else 'quickstart_heads stays'}"
    )
