"""The rule of "Repeated spans with the decay per feature, three seeds" (docs/results/far_term README):
quickstart_heads_feature_decay_copy at seeds 0, 1 and 2 against quickstart_heads_feature_decay at the same seeds, on
the 30 choosing passkey prompts (retrieval seed 1, 15 at 2k and 15 at 4k), validation perplexity (32 blocks, paired
by seed) and seed 0's 40 recall items.

    python docs/results/far_term/records/copy_seeds_rule.py [FITS [PASSKEYS [BASE_VALIDATION]]]
        (defaults runs/far_term, runs/far_term_copy, runs/far_term_val: copy_seeds_choice.sh's folders)

The rule, fixed before the fits: to the test split if (1) every seed finds >= 8 of 15 at 2k and at 4k, (2) the
validation perplexity over the three seeds, each / the feature-decay fit of its seed, is <= 1.005 on average (the
geometric mean of the per-seed ratios, lit_dof.evaluation.stats.paired_seed_difference), and (3) seed 0 recalls
>= 22 of 40 items. Without the cells: the records committed beside this script, <row>[_seed<s>]_{fit,ppl,
choose_passkey}.json, <row>_recall.json, quickstart_heads_feature_decay[_seed<s>]_ppl.json.
"""

import argparse
from pathlib import Path

from rule_records import answer_openings, gained_lost, hits, load, passkey

from lit_dof.evaluation.position_perplexity import bucket_ratios
from lit_dof.evaluation.stats import paired_seed_difference

ROW, BASE = "quickstart_heads_feature_decay_copy", "quickstart_heads_feature_decay"
SEEDS = (0, 1, 2)


def folder(root: Path, seed: int) -> Path:
    """The folder of a seed's cells under a run folder's ``C64`` (seed 0's are in it)."""
    return root / f"seed{seed}" if seed else root


def tag(seed: int) -> str:
    """The committed records' seed tag."""
    return "" if seed == 0 else f"_seed{seed}"


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("fits", nargs="?", default="runs/far_term")
parser.add_argument("passkeys", nargs="?", default="runs/far_term_copy")
parser.add_argument("base_validation", nargs="?", default="runs/far_term_val")
args = parser.parse_args()
fits, keys, val = (Path(p) / "C64" for p in (args.fits, args.passkeys, args.base_validation))
ok, misses, own, base_ppl = {}, [], {}, {}
for seed in SEEDS:
    fit = load(folder(fits, seed) / ROW / "fit.json", f"{ROW}{tag(seed)}_fit.json")
    if fit is None:
        print(f"seed {seed}: not fitted yet")
        continue
    line = f"seed {seed}: fit {fit['wall_seconds'] / 60:.0f} min, Σ M {fit['total_features']:.0f}"
    record = passkey(folder(keys, seed), ROW, f"{ROW}{tag(seed)}_choose_passkey.json")
    base_key = passkey(folder(keys, seed), BASE, f"{BASE}{tag(seed)}_choose_passkey.json")
    if record:
        per = [hits(record, context) for context in (2048, 4096)]
        was = [hits(base_key, context)[0] for context in (2048, 4096)] if base_key else ["–", "–"]
        line += f"; choosing passkeys 2k {per[0][0]}/{per[0][1]}, 4k {per[1][0]}/{per[1][1]}"
        line += f" ({BASE}: {was[0]}, {was[1]})"
        ok[f"seed {seed} >= 8/15 at 2k and 4k"] = all(found >= 8 for found, _ in per)
        if not ok[f"seed {seed} >= 8/15 at 2k and 4k"]:
            misses.append(f"seed {seed}'s answers: " + answer_openings(record))
    ppl = load(folder(fits, seed) / ROW / "ppl.json", f"{ROW}{tag(seed)}_ppl.json")
    base = load(folder(fits if seed == 0 else val, seed) / BASE / "ppl.json", f"{BASE}{tag(seed)}_ppl.json")
    if ppl and base:
        v = bucket_ratios(ppl["by_position"], base["by_position"])["all"]
        own[seed], base_ppl[seed] = ppl["ppl"], base["ppl"]
        line += f"; validation ppl {ppl['ppl']:.2f}, / {BASE}'s {base['ppl']:.2f}: {v['ratio']:.3f} ± {v['stderr']:.3f}"
    elif ppl:
        line += f"; validation ppl {ppl['ppl']:.2f} ({BASE} at this seed not measured on validation)"
    print(line)
for line in misses:
    print("  " + line)
if len(own) == len(SEEDS):
    paired = paired_seed_difference(own, base_ppl, log=True)
    print(
        f"validation ppl / {BASE}'s, paired by seed: {paired['ratio']:.4f} (log ratio {paired['difference']:+.4f} "
        f"± {paired['stderr']:.4f}, mean ± SE over the 3 seeds)"
    )
    ok["validation ppl ratio <= 1.005"] = paired["ratio"] <= 1.005
recall = load(fits / ROW / "retrieval" / "recall.json", f"{ROW}_recall.json")
if recall:
    recalled = sum(recall["items"]["exact_match"])
    ok["seed 0 recall >= 22/40"] = recalled >= 22
    for other in (BASE, "quickstart_heads"):
        record = load(fits / other / "retrieval" / "recall.json", f"{other}_recall.json")
        gained, lost = gained_lost(recall, record)
        print(
            f"seed 0 recall {recalled:.0f}/40; paired with {other}'s ({sum(record['items']['exact_match']):.0f}): "
            f"gains {gained}, loses {lost}"
        )
for name, passed in ok.items():
    print(f"  {name}: {passed}")
complete = len(ok) == len(SEEDS) + 2
if not all(ok.values()):
    print("not kept" + ("" if complete else ": a condition already fails, whatever the fits still to come give"))
else:
    print("to the test split" if complete else "rule not complete")
