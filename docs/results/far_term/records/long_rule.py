"""The rule of "Long blocks at the quickstart's decay" (docs/results/far_term README), and the same rule of "The
quickstart's blocks at the copy row's decay", applied: a candidate (``--row``, default quickstart_heads_long) against
quickstart_heads (seed 0 each) on validation (sliding perplexity at 256–511 and over all positions, paired over the 32
blocks; 40 recall items), on the choosing passkey prompts (retrieval seed 1, 15 at 2k and 15 at 4k) and by its fit's
wall time; quickstart_heads_reach_copy beside them, and the long choosing set's 2048–4095 ratios to both.

    python docs/results/far_term/records/long_rule.py [VALIDATION_OUT [PASSKEY_OUT [LONG_CHOICE_JSON]]] [--row ROW]
        [--condition passkey|long] [--beside ROW ...]

``--condition long`` (the rule of "A decay per feature"): the passkey condition is replaced by the long choosing
set's — the candidate's perplexity at in-document 2048–4095 below quickstart_heads' by more than 2 SEs of the paired
log ratio over the articles; the passkeys are then reported beside the rule, not in it.

``--beside`` adds neighbours to quickstart_heads and quickstart_heads_reach_copy (reported, not in the rule).
``--budget C`` reads the candidate's cells at that budget (``C<C>/<row>``; the neighbours stay at C = 64) and its
records and long-choosing-set entry as ``<row>_C<C>`` (C = 64: ``<row>``).

(defaults runs/far_term, runs/far_term_copy and records/long_choice.json; without the cells, the copies committed
beside this script: <row>_{fit,ppl,recall,choose_passkey}.json.)
"""

import argparse
import json
from pathlib import Path

from rule_records import HERE, gained_lost, hits, load, passkey

from lit_dof.evaluation.position_perplexity import bucket_ratios

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("validation", nargs="?", default="runs/far_term")
parser.add_argument("passkey", nargs="?", default="runs/far_term_copy")
parser.add_argument("long_choice", nargs="?", default=str(HERE / "long_choice.json"))
parser.add_argument("--row", default="quickstart_heads_long")
parser.add_argument("--condition", choices=("passkey", "long"), default="passkey")
parser.add_argument("--beside", action="append", default=[])
parser.add_argument("--budget", type=int, default=64)
args = parser.parse_args()
LONG, BASE, COPY = Path(args.long_choice), "quickstart_heads", "quickstart_heads_reach_copy"
ROW = args.row if args.budget == 64 else f"{args.row}_C{args.budget}"  # the candidate's name in records and here
NEIGHBOURS = (BASE, COPY, *args.beside)
ROWS = (*NEIGHBOURS, ROW)


def cell(root: str, r: str) -> Path:
    """Row ``r``'s cell under a run folder (the candidate's at its budget, the neighbours' at C = 64)."""
    return Path(root) / (f"C{args.budget}/{args.row}" if r == ROW else f"C64/{r}")


ok = {}
ppl = {r: load(cell(args.validation, r) / "ppl.json", f"{r}_ppl.json") for r in ROWS}
recall = {r: load(cell(args.validation, r) / "retrieval" / "recall.json", f"{r}_recall.json") for r in ROWS}
fit = {r: load(cell(args.validation, r) / "fit.json", f"{r}_fit.json") for r in ROWS}
for r in ROWS:  # what each row has of validation ppl, recall and its fit
    parts = [f"validation ppl {ppl[r]['ppl']:.2f}"] if ppl[r] else []
    parts += [f"recall {sum(recall[r]['items']['exact_match']):.0f}/40"] if recall[r] else []
    parts += [f"fit {fit[r]['wall_seconds'] / 60:.0f} min, Σ M {fit[r]['total_features']:.0f}"] if fit[r] else []
    if parts:
        print(f"{r}: " + ", ".join(parts))
if ppl[ROW]:
    for r in NEIGHBOURS:
        assert ppl[ROW]["split"] == ppl[r]["split"] == "validation", "not the rule's blocks"
        assert ppl[ROW]["tokens"] == ppl[r]["tokens"], "not the rule's blocks"
        ratios = bucket_ratios(ppl[ROW]["by_position"], ppl[r]["by_position"])
        print(f"validation, {ROW} / {r} (paired over {ratios['all']['blocks']} blocks):")
        for bucket, v in ratios.items():
            z = v["log_ratio"] / v["stderr_log"]
            print(f"  {bucket:>9}: {v['ratio']:.3f} ± {v['stderr']:.3f} (log ratio {v['log_ratio']:+.4f}, {z:+.1f} SE)")
        if r == BASE:
            v = ratios["256-511"]
            ok["validation 256-511 not above quickstart_heads by > 2 paired SEs"] = (
                v["log_ratio"] <= 2 * v["stderr_log"]
            )
else:
    print("validation: not measured yet")
if recall[ROW]:
    recalled = sum(recall[ROW]["items"]["exact_match"])
    ok["recall >= 22/40"] = recalled >= 22
    for r in NEIGHBOURS:
        if recall[r]:
            gained, lost = gained_lost(recall[ROW], recall[r])
            print(f"recall {recalled:.0f}/40, paired with {r} over the 40 items: gains {gained}, loses {lost}")
if fit[ROW]:
    ok["fit < 60 min"] = fit[ROW]["wall_seconds"] < 3600

keys = {r: passkey(cell(args.passkey, r).parent, cell(args.passkey, r).name, f"{r}_choose_passkey.json") for r in ROWS}
for r, record in keys.items():
    if record:
        per = [hits(record, c) for c in (2048, 4096)]
        total = "all: %d/%d" % tuple(map(sum, zip(*per)))
        print(
            f"{r} passkey (choosing prompts):",
            ", ".join("%d: %d/%d" % (c, *h) for c, h in zip((2048, 4096), per)),
            total,
        )
if keys[ROW]:
    if args.condition == "passkey":
        ok["passkey >= 8/15 at 2048 and at 4096"] = all(hits(keys[ROW], c)[0] >= 8 for c in (2048, 4096))
    for r in NEIGHBOURS:
        if keys[r]:
            gained, lost = gained_lost(keys[ROW], keys[r])
            print(f"  paired with {r} over the 30 prompts: {ROW} gains {gained}, loses {lost}")
else:
    print("passkey: not measured yet")

long = json.loads(LONG.read_text()) if LONG.exists() else {}
if ROW in long:
    print(f"long choosing set ({long['articles']} articles), {ROW} / each neighbour and its own (a), (b):")
    for r in (*NEIGHBOURS, "a", "b"):
        other = long[ROW][r] if r in ("a", "b") else long.get(r, {}).get("student")
        if other:
            v = bucket_ratios(long[ROW]["student"], other)["2048-4095"]
            if r == BASE and args.condition == "long":
                ok["long choosing set 2048-4095 below quickstart_heads by > 2 paired SEs"] = (
                    v["log_ratio"] < -2 * v["stderr_log"]
                )
            print(
                f"  2048-4095 / {r}: {v['ratio']:.3f} ± {v['stderr']:.3f} ({v['log_ratio'] / v['stderr_log']:+.1f} SE)"
            )
    for r in ROWS:
        if r in long:
            shares = ", ".join(f"{b} {v:.0%}" for b, v in long[r]["closed"].items() if v is not None)
            b = long[r]["b"]
            print(
                f"  {r}: (a)-teacher gap closed {shares}; state {long[r]['state_bytes'] / 1e6:.2f} MB at 512 "
                f"tokens, (b) window {b['window']} + {b['sinks']}"
            )
else:
    print("long choosing set: not measured yet")

for condition, met in ok.items():
    print(f"  {condition}: {met}")
if len(ok) == 4:
    print("rule:", f"{ROW} goes to the test-split study" if all(ok.values()) else f"{ROW} is not kept")
