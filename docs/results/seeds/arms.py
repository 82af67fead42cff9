"""The budgets of the seeds study's arms at equal Σ M (docs/results/seeds README, "The study: design"): each arm's
Σ M — the feature dims summed over layers, a layer's the mean over its KV heads, the 18 exact heads counting 0, as a
fit reports ``total_features`` — from the shipped recipe's DoF report (seed 0's fit, quickstart_heads_dof.json here)
and its exact heads (the zeros of ../far_term/records/quickstart_heads_fit.json), for a range of budgets C.

    python docs/results/seeds/arms.py

The exact heads are zeroed after the allocation (lit_dof.pipeline.allocation spreads C over every linearised
layer or KV head; the exact ones then keep softmax), so at one C the arms hold different Σ M; the study gives each arm
the C whose Σ M is nearest the DoF arm's.
"""

import json
from pathlib import Path

from lit_dof.dof import DoFReport
from lit_dof.pipeline.allocation import AttentionShape, allocate_from_report
from lit_dof.students.surgery import layer_mean_dims, with_exact_heads

HERE = Path(__file__).parent
FIT = HERE.parent / "far_term" / "records" / "quickstart_heads_fit.json"
# arm: (strategy, multiple_of, budgets tried); min_dim 8 as configs/quickstart.yaml; dof_head rounds to 8 as
# configs/methods/dof_head.yaml (few distinct M per layer)
ARMS = {"dof": ("dof", 1, [64]), "fix": ("fix", 1, [16, 64, 65, 66, 67]), "dof_head": ("dof_head", 8, [64, 66, 68, 70])}


def main() -> None:
    """Print each arm's Σ M at each budget tried."""
    report = DoFReport.load(HERE / "quickstart_heads_dof.json")
    fitted = json.loads(FIT.read_text())
    exact = {
        i: [h for h, m in enumerate(x) if m == 0] for i, x in enumerate(fitted["feature_dims"]) if isinstance(x, list)
    }
    layers = len(fitted["feature_dims"])
    shape = AttentionShape(num_layers=layers, head_dim=64, num_heads=9, num_kv_heads=3, linearizable=(True,) * layers)
    count = sum(map(len, exact.values()))
    print(f"exact heads: {count} of {3 * layers} KV heads; the fit's Σ M {fitted['total_features']:.1f}")
    for arm, (strategy, multiple_of, budgets) in ARMS.items():
        for budget in budgets:
            dims = with_exact_heads(
                allocate_from_report(report, shape, strategy, budget, multiple_of, 8), exact, [3] * layers
            )
            print(f"{arm:>8} C={budget:<3} Σ M {sum(layer_mean_dims(dims)):7.1f}")  # as a fit's total_features


if __name__ == "__main__":
    main()
