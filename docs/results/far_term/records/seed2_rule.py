"""The reading of "Why seed 2 misses the passkeys" (docs/results/far_term README): the 30 choosing passkey prompts
(retrieval seed 1, 15 at 2k and 15 at 4k) found by quickstart_heads_feature_decay at seeds 0, 1 and 2 (step 1) and by
the three seed-0 fits that each take one of seed 2's settings — data order, initialisation, DoF sample (step 2).

    python docs/results/far_term/records/seed2_rule.py [PASSKEY_OUT [FIT_OUT]]
        (defaults runs/far_term_copy and runs/far_term; test-split fits in runs/far_term_test)

A fit "misses" with fewer than 8 of 15 at 2k or at 4k (the choosing rule's bar); for a fit that misses, its
commonest answer openings are printed; for step 2's fits, their fit time, Σ M, validation perplexity (paired with
seed 0's over the 32 blocks) and in how many of the 30 layers their feature dims differ from seed 0's and seed 2's.
Step 2 is read only if seed 2 misses and seed 0 does not; a setting "carries" the miss if its fit misses. Without the
cells, the copies committed beside this script: <row>_choose_passkey.json (seed s > 0:
<row>_seed<s>_choose_passkey.json), <row>_fit.json (seed s > 0: <row>_seed<s>_fit.json) and <row>_ppl.json.
"""

import argparse
from pathlib import Path

from rule_records import answer_openings, hits, load, misses, passkey

from lit_dof.evaluation.position_perplexity import bucket_ratios

ROW = "quickstart_heads_feature_decay"
PARTS = {"data2": "data order", "init2": "initialisation", "dof2": "DoF sample"}


def moved(a: list, b: list) -> tuple[int, float]:
    """Layers whose dims differ between two fits' ``feature_dims`` (an int per layer, or a list per KV head), and
    Σ |ΔM| over every head as a share of the first fit's Σ M."""
    flat = [([x] if isinstance(x, int) else x, [y] if isinstance(y, int) else y) for x, y in zip(a, b)]
    shift = sum(abs(u - v) for xs, ys in flat for u, v in zip(xs, ys))
    return sum(x != y for x, y in zip(a, b)), shift / sum(sum(xs) for xs, _ in flat)


def show(name: str, record: dict | None, fit: dict | None = None) -> None:
    """One fit's hits per context (and, for a miss, its commonest answer openings), or that it is not measured."""
    if record is None:
        print(f"{name}: not measured yet")
        return
    per = [hits(record, context) for context in (2048, 4096)]
    made = f" (fit {fit['wall_seconds'] / 60:.0f} min, Σ M {fit['total_features']:.0f})" if fit else ""
    print(
        f"{name}{made}: 2k {per[0][0]}/{per[0][1]}, 4k {per[1][0]}/{per[1][1]}"
        + (" — misses" if misses(record) else "")
    )
    if misses(record):
        print("    answers: " + answer_openings(record))


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("cells", nargs="?", default="runs/far_term_copy")
parser.add_argument("fits", nargs="?", default="runs/far_term")
args = parser.parse_args()
cells, fits = Path(args.cells) / "C64", Path(args.fits) / "C64"
test_fits = Path(f"{args.fits}_test") / "C64"
seeds = {0: passkey(cells, ROW)}
for seed in (1, 2):
    seeds[seed] = passkey(cells / f"seed{seed}", ROW, f"{ROW}_seed{seed}_choose_passkey.json")
for seed, record in seeds.items():
    show(f"{ROW} seed {seed}", record)
if seeds[2] is None or seeds[0] is None:
    print("step 1 not complete")
elif not misses(seeds[2]) or misses(seeds[0]):
    print("step 1: seed 2 does not miss where seed 0 finds them on the choosing prompts — step 2 is not read")
else:
    print("step 1: seed 2 misses on the choosing prompts too; step 2:")
    base_ppl = load(fits / ROW / "ppl.json", f"{ROW}_ppl.json")
    dims = {0: load(fits / ROW / "fit.json", f"{ROW}_fit.json")}
    for seed in (1, 2):
        dims[seed] = load(test_fits / f"seed{seed}" / ROW / "fit.json", f"{ROW}_seed{seed}_fit.json")
    for seed in (1, 2):
        if dims[0] and dims[seed]:
            n, shift = moved(dims[0]["feature_dims"], dims[seed]["feature_dims"])
            print(f"  seed {seed}'s feature dims differ from seed 0's in {n} of 30 layers (Σ|ΔM| {shift:.1%} of Σ M)")
    parts = {part: passkey(cells, f"{ROW}_{part}") for part in PARTS}
    for part, record in parts.items():
        fit = load(cells / f"{ROW}_{part}" / "fit.json", f"{ROW}_{part}_fit.json")
        show(f"  seed 0 with seed 2's {PARTS[part]} ({ROW}_{part})", record, fit)
        ppl = load(fits / f"{ROW}_{part}" / "ppl.json", f"{ROW}_{part}_ppl.json")
        if ppl and base_ppl:
            v = bucket_ratios(ppl["by_position"], base_ppl["by_position"])["all"]
            print(f"    validation ppl {ppl['ppl']:.2f}, / seed 0's {v['ratio']:.3f} ± {v['stderr']:.3f} (32 blocks)")
        if fit and dims[0] and dims[2]:
            (n0, s0), (n2, s2) = (moved(dims[s]["feature_dims"], fit["feature_dims"]) for s in (0, 2))
            print(
                f"    feature dims differ from seed 0's in {n0} of 30 layers (Σ|ΔM| {s0:.1%} of Σ M), "
                f"from seed 2's in {n2} ({s2:.1%})"
            )
    if all(parts.values()):
        carriers = [PARTS[p] for p, r in parts.items() if misses(r)]
        print("carried by: " + (", ".join(carriers) if carriers else "none of the three alone (an interaction)"))
