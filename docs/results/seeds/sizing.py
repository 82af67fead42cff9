"""Size the seeds study of issue #41 from the seed spread of the shipped recipe (docs/results/seeds README): per
endpoint, the spread of `quickstart_heads` over its 3 test-split fits (docs/results/far_term/heads_test) and the
smallest paired difference between two arms that 5 seeds detect (two-sided α = 0.05, power 0.8).

    python docs/results/seeds/sizing.py [--seeds 5]

The difference of two arms at one seed is taken to vary as two independent fits do (SD √2 × the seed SD); pairing by
seed (the same data order) can only lower that. Perplexity endpoints are in log units (a difference d is a ratio
e^d); retrieval endpoints in exact-match points.
"""

import argparse
import json
import math
import statistics
from pathlib import Path

from scipy import stats

RECORD = Path(__file__).parents[1] / "far_term" / "heads_test" / "comparison.json"
ENDPOINTS = {
    "log ppl, test split (sliding window)": lambda c: math.log(c["ppl"]),
    "log ppl, test split at 256-511": lambda c: math.log(c["by_position"]["buckets"]["256-511"]["ppl"]),
    "log ppl, long documents at 2048-4095": lambda c: math.log(c["long_documents"]["buckets"]["2048-4095"]["ppl"]),
    "passkey exact match (30 prompts)": lambda c: c["retrieval"]["passkey"]["exact_match"],
    "recall exact match (30 prompts)": lambda c: c["retrieval"]["recall"]["exact_match"],
}


def main() -> None:
    """Print each endpoint's per-seed values, its seed SD and the smallest detectable paired difference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="fits per arm in the planned study")
    n = parser.parse_args().seeds
    cells = [c for c in json.loads(RECORD.read_text())["cells"] if c["row"] == "quickstart_heads"]
    factor = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) / math.sqrt(n)
    print(f"{len(cells)} fits of quickstart_heads ({RECORD.parent.name}); {n} seeds per arm: detectable = "
          f"{factor:.3f} × √2 × seed SD")  # fmt: skip
    for name, read in ENDPOINTS.items():
        values = [read(c) for c in sorted(cells, key=lambda c: c["seed"])]
        sd = statistics.stdev(values)
        detectable = factor * math.sqrt(2) * sd
        unit = f"ratio {math.exp(detectable):.4f}" if name.startswith("log") else f"{detectable * 100:.1f} points"
        print(f"{name}: per seed {', '.join(f'{v:.4f}' for v in values)}; seed SD {sd:.4f}; detectable {unit}")


if __name__ == "__main__":
    main()
