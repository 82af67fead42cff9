"""How many far key/value pairs can a far memory of M features give back? The additive far term (linear attention)
against the delta-rule memory, on positive random features of random keys (no model, no training).

N pairs (k_i, v_i) are written into one head's memory in order — additive: the normalised kernel average
Σ κ(q, k_i) v_i / Σ κ(q, k_i) (lit_dof.attention.ops.linear); delta: S_t = (I − β κ̂_t κ̂_tᵀ) S_{t−1} + β κ̂_t v_tᵀ with
unit features κ̂ = φ/‖φ‖ and β = 1 (lit_dof.attention.ops.delta_rule) — then each stored key is asked for its value.
Printed per N: the mean cosine between the value read back and the value stored, for the oldest, the middle and
the newest tenth of the pairs, mean over ``--draws`` independent draws ± SE. φ is the positive random feature
map of the method (LearnedPRF at initialisation, head size d, M features); keys and values are standard normal, keys
scaled so that qᵀk/√d has the spread of a real head's logits (``--key_scale``).

Usage: python tools/far_memory_capacity.py [--d 64] [--features 64] [--pairs 16 64 256 1024] [--draws 5]
"""

from __future__ import annotations

import argparse
import math

import torch

from lit_dof.attention import LearnedPRF
from lit_dof.attention.ops.delta_rule.chunked import chunked_delta_rule
from lit_dof.attention.ops.delta_rule.far import unit_features
from lit_dof.attention.ops.linear.chunked import chunked_linear_attention


def read_back(memory: str, log_phi: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The values each stored key reads back after all N writes: ``(N, D)``; ``log_phi`` ``(N, M)``."""
    N = log_phi.shape[0]
    keys, queries = log_phi[None, None], log_phi[None, None]
    if memory == "additive":  # all N keys written, then every key as a query: the last query row sees them all
        _, state = chunked_linear_attention(keys, keys, values[None, None], chunk_size=64)
        lq = queries[0, 0] + state.log_scale[0, 0]
        weights = (lq - lq.amax(-1, keepdim=True)).exp()  # (N, M), per-row constant cancels
        return (weights @ state.kv[0, 0]) / (weights @ state.k_sum[0, 0, :, None])
    unit, _ = unit_features(keys)
    _, state = chunked_delta_rule(unit, unit, values[None, None], torch.ones(1, 1, N), chunk_size=64)
    return unit[0, 0] @ state[0, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=64, help="head size d")
    parser.add_argument("--features", type=int, default=64, help="M, features of the map")
    parser.add_argument("--pairs", type=int, nargs="+", default=[16, 64, 256, 1024], help="N, pairs written")
    parser.add_argument("--draws", type=int, default=5, help="independent draws per N")
    parser.add_argument("--key_scale", type=float, default=1.5, help="std of the keys' and queries' entries")
    args = parser.parse_args()
    print(
        f"d={args.d} M={args.features} draws={args.draws} key_scale={args.key_scale} beta=1 torch={torch.__version__}"
    )
    print("memory    N      oldest 10%        middle 10%        newest 10%   (cosine read-back vs stored, mean ± SE)")
    for N in args.pairs:
        for memory in ("additive", "delta"):
            rows = []
            for draw in range(args.draws):
                g = torch.Generator().manual_seed(1000 * N + draw)
                fm = LearnedPRF(args.d, 1, args.features, seed=draw)
                keys = torch.randn(1, 1, N, args.d, generator=g) * args.key_scale / args.d**0.25
                values = torch.randn(N, args.d, generator=g)
                with torch.no_grad():
                    got = read_back(memory, fm.log_features(keys)[0, 0], values)
                cos = torch.nn.functional.cosine_similarity(got, values, dim=-1)
                tenth = max(1, N // 10)
                mid = N // 2 - tenth // 2
                rows.append([cos[:tenth].mean(), cos[mid : mid + tenth].mean(), cos[-tenth:].mean()])
            table = torch.tensor(rows)
            mean, se = table.mean(0), table.std(0) / math.sqrt(args.draws)
            cells = "  ".join(f"{m:+.3f} ± {s:.3f}" for m, s in zip(mean.tolist(), se.tolist()))
            print(f"{memory:8s} {N:5d}   {cells}")


if __name__ == "__main__":
    main()
