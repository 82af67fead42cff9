"""The reading of "Two more exact heads against seed 2's miss" (docs/results/far_term README): the fits of
quickstart_heads_reach_1k_heads20 on the 30 choosing passkey prompts (retrieval seed 1, 15 at 2k and 15 at 4k), their
validation perplexity against quickstart_heads_reach_1k's seed-0 fit (the same 32 blocks, paired), their feature
dims and their decode state at 4k against the teacher's KV cache.

    python docs/results/far_term/records/heads20_rule.py [FIT_OUT]
        (default runs/far_term; the choosing prompts in FIT_OUT_copy)

Step 1 is seed 2; step 2 seeds 0 and 1. A fit "misses" with fewer than 8 of 15 at 2k or at 4k (the choosing rule's
bar). Without the cells, the copies committed beside this script: <row>_seed<s>_{choose_passkey,fit,ppl}.json and
<row>_seed<s>_state.txt (written by heads20_choice.sh).
"""

import argparse
from pathlib import Path

from rule_records import HERE, answer_openings, hits, load, misses, passkey

from lit_dof.evaluation.position_perplexity import bucket_ratios

ROW, BASE = "quickstart_heads_reach_1k_heads20", "quickstart_heads_reach_1k"


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("fits", nargs="?", default="runs/far_term")
args = parser.parse_args()
fits, copies = Path(args.fits) / "C64", Path(f"{args.fits}_copy") / "C64"
base_ppl = load(fits / BASE / "ppl.json", f"{BASE}_ppl.json")
verdicts = {}
for seed in (2, 0, 1):
    folder = f"seed{seed}/" if seed else ""
    name = f"{ROW}_seed{seed}"
    record = passkey(copies / folder, ROW, f"{name}_choose_passkey.json")
    if record is None:
        print(f"seed {seed}: not measured yet")
        continue
    fit = load(fits / f"{folder}{ROW}" / "fit.json", f"{name}_fit.json")
    ppl = load(fits / f"{folder}{ROW}" / "ppl.json", f"{name}_ppl.json")
    per = [hits(record, context) for context in (2048, 4096)]
    verdicts[seed] = not misses(record)
    print(
        f"seed {seed} (fit {fit['wall_seconds'] / 60:.0f} min, Σ M {fit['total_features']:.0f}): choosing passkeys "
        f"2k {per[0][0]}/{per[0][1]}, 4k {per[1][0]}/{per[1][1]}" + ("" if verdicts[seed] else " — misses")
    )
    if not verdicts[seed]:
        print("    answers: " + answer_openings(record))
    if ppl and base_ppl:
        v = bucket_ratios(ppl["by_position"], base_ppl["by_position"])["all"]
        ratio = f"{v['ratio']:.3f} ± {v['stderr']:.3f}"
        print(f"    validation ppl {ppl['ppl']:.2f}; / {BASE} seed 0's {ratio} (32 blocks)")
    state = HERE / f"{name}_state.txt"
    if state.exists():
        print("    decode state: " + state.read_text().strip().split(": ", 1)[1])
if 2 in verdicts and not verdicts[2]:
    print("step 1: seed 2 misses with 20 exact heads — the row is not kept (the design)")
elif verdicts.keys() == {0, 1, 2}:
    kept = all(verdicts.values())
    found = "all three seeds find ≥ 8 of 15 at 2k and 4k — to the test split"
    print("step 2: " + (found if kept else "a seed misses — not kept"))
elif 2 in verdicts:
    print("step 1: seed 2 finds ≥ 8 of 15 at 2k and at 4k — step 2 (seeds 0 and 1) runs")
