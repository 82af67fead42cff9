"""The rule of "Copying from beyond the window" (docs/results/far_term README), applied: quickstart_heads_reach_copy
against quickstart_heads_reach (seed 0 each) on the choosing passkey prompts (retrieval seed 1) and on validation
(perplexity over 32 blocks, 40 recall items), and its fit's wall time; quickstart_heads' figures beside them.

    python docs/results/far_term/records/copy_rule.py [PASSKEY_OUT [VALIDATION_OUT]]

(defaults runs/far_term_copy and runs/far_term; without the cells, the copies committed beside this script:
quickstart_heads_reach{,_copy}_choose_passkey.json, quickstart_heads_reach_copy_{fit,ppl,recall}.json.)
"""

import math
import statistics as st
import sys
from pathlib import Path

from rule_records import gained_lost, hits, load, passkey

PASSKEY = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/far_term_copy") / "C64"
VALIDATION = Path(sys.argv[2] if len(sys.argv) > 2 else "runs/far_term") / "C64"
BASE, ROW = "quickstart_heads_reach", "quickstart_heads_reach_copy"


base, row, shipped = (passkey(PASSKEY, r) for r in (BASE, ROW, "quickstart_heads"))
ok = {}
if base and row:
    for name, record in (("quickstart_heads", shipped), (BASE, base), (ROW, row)):
        if not record:
            continue
        print(name, "passkey (choosing prompts):", ", ".join("%d: %d/%d" % (c, *hits(record, c)) for c in (2048, 4096)))
    gained, lost = gained_lost(row, base)
    print(f"paired over the {len(row['items']['exact_match'])} prompts: {ROW} gains {gained}, loses {lost}")
    ok["passkey >= 0.5 at 2048 and 4096"] = all(h / n >= 0.5 for h, n in (hits(row, 2048), hits(row, 4096)))
    ok[f"passkey above {BASE} (gained > lost)"] = gained > lost
else:
    print("passkey: not measured yet")


def validation(row):
    """A row's validation ppl, recall and fit records (its cell's, else the committed copies)."""
    return (
        load(VALIDATION / row / "ppl.json", f"{row}_ppl.json"),
        load(VALIDATION / row / "retrieval" / "recall.json", f"{row}_recall.json"),
        load(VALIDATION / row / "fit.json", f"{row}_fit.json"),
    )


records = {name: validation(name) for name in ("quickstart_heads", BASE, ROW)}  # the table's columns
for name, (p, r, f) in records.items():
    if p and r and f:
        print(
            f"{name}: validation ppl {p['ppl']:.2f}, recall {sum(r['items']['exact_match']):.0f}/40, "
            f"fit {f['wall_seconds'] / 60:.0f} min, Σ M {f['total_features']:.0f}, "
            f"in-fit validation at step {f['val_curve'][-1][0]}: {f['val_curve'][-1][1]:.3f}"
        )
(ppl, recall, fit), base_ppl = records[ROW], records[BASE][0]
if ppl and recall:
    assert ppl["split"] == "validation" and ppl["tokens"] == base_ppl["tokens"], "not the rule's blocks"
    d = [x - y for x, y in zip(ppl["by_position"]["block_nll"], base_ppl["by_position"]["block_nll"])]
    se = st.stdev(d) / math.sqrt(len(d))
    recalled = sum(recall["items"]["exact_match"])
    print(
        f"validation: ppl {ppl['ppl']:.2f} against {base_ppl['ppl']:.2f}, "
        f"paired log ratio {st.mean(d):+.4f} ± {se:.4f} (ratio {math.exp(st.mean(d)):.3f}); recall {recalled:.0f}/40"
    )
    ok["validation ppl not above by > 2 block SEs"] = st.mean(d) <= 2 * se
    ok["recall >= 22/40"] = recalled >= 22
else:
    print("validation: not measured yet")
if fit:
    print(f"fit: {fit['wall_seconds'] / 60:.0f} min, Σ M {fit['total_features']:.0f}")
    ok["fit < 60 min"] = fit["wall_seconds"] < 3600
for condition, met in ok.items():
    print(f"  {condition}: {met}")
if len(ok) == 5:
    print("rule:", f"{ROW} goes to the test-split study" if all(ok.values()) else f"{BASE} stays")
