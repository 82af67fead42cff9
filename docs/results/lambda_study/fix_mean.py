"""Each arm of the λ study against Fix's seed spread (docs/results/lambda_study README, "Against both Fix seeds"):
its sliding-window perplexity as a fraction of the same seed's Fix and of the geometric mean of Fix's two seeds.

    python docs/results/lambda_study/fix_mean.py
"""

import json
import math
from pathlib import Path

cells = json.loads((Path(__file__).parent / "comparison.json").read_text())["cells"]
ppl = {(c["row"], c["seed"]): c["ppl"] for c in cells if c.get("ppl")}
fix = {seed: p for (row, seed), p in ppl.items() if row == "fix"}
both = math.exp(sum(math.log(p) for p in fix.values()) / len(fix))
print(f"Fix: seeds {', '.join(f'{s}: {p:.1f}' for s, p in sorted(fix.items()))}; geometric mean {both:.1f}")
for (row, seed), p in sorted(ppl.items(), key=lambda item: (item[0][1], item[1])):
    if row != "fix":
        print(f"{row} (seed {seed}): {p:.1f}; / Fix seed {seed} {p / fix[seed]:.3f}; / both Fix seeds {p / both:.3f}")
