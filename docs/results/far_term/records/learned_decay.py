"""The decay each far term learned (docs/results/far_term README, "A decay per head, learned"): τ = 1/λ in tokens per
windowed KV head (per feature of each, for a decay per feature: uncapped, as stored), read from a student's weights
(``far_log_decay`` = log λ), or from the copy committed here.

    python docs/results/far_term/records/learned_decay.py [STUDENT_DIR] [--save learned_decay.json]

Prints per layer the heads' τ, then min, quartiles, max and the heads below 128 and above 512 tokens: of every
windowed KV head, of the layers below ``--split`` and of the rest.
"""

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("student", nargs="?", help="an exported student folder (default: the committed copy)")
parser.add_argument("--save", help="write the per-layer τ to this JSON file")
parser.add_argument("--split", type=int, default=11, help="also summarise the layers below and from this one")
args = parser.parse_args()

if args.student:
    from safetensors.torch import load_file

    tau = {}
    for path in sorted(Path(args.student).glob("*.safetensors")):
        for name, log_rate in load_file(str(path)).items():
            if name.endswith("far_log_decay"):
                layer = int(name.split(".layers.")[1].split(".")[0])
                tau.setdefault(str(layer), []).extend((-log_rate.double()).exp().flatten().tolist())  # per feature too
else:
    tau = json.loads((HERE / "quickstart_heads_learn_decay_tau.json").read_text())["tau"]
tau = dict(sorted(tau.items(), key=lambda item: int(item[0])))
if args.save:
    Path(args.save).write_text(json.dumps({"tau": tau, "unit": "tokens"}, indent=1) + "\n")
for layer, values in tau.items():
    print(f"layer {layer:>2}: " + " ".join(f"{t:.0f}" for t in values))


def summary(label: str, values: list[float]) -> None:
    """Print min, quartiles, max and the counts below 128 and above 512 tokens of ``values``."""
    every = sorted(values)
    q1, median, q3 = statistics.quantiles(every, n=4)
    print(
        f"{label}: {len(every)} decays (per windowed KV head, or per feature), τ min {every[0]:.0f}, "
        f"quartiles {q1:.0f} / {median:.0f} / "
        f"{q3:.0f}, max {every[-1]:.0f}; below 128: {sum(t < 128 for t in every)}, above 512: "
        f"{sum(t > 512 for t in every)}"
    )


summary("all layers", [t for values in tau.values() for t in values])
summary(f"layers < {args.split}", [t for layer, values in tau.items() if int(layer) < args.split for t in values])
summary(f"layers >= {args.split}", [t for layer, values in tau.items() if int(layer) >= args.split for t in values])
