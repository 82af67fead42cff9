"""Benchmark: DoF estimation for a SmolLM2-sized model (30 layers × 9 heads, J = 1024, d = 64) on this device.

Synthetic pooled vectors with SmolLM2-like scales: per head, squared norms ‖x‖²/√d spread over 0…160 (the
measured range of its scaled scores), so the Gram entries span e^0…e^160. Prints the wall time of the
factorised estimator at one λ, the per-layer spread, and — for comparison on a few heads — how far a
plain float64 eigvalsh is from it.

Usage: python scripts/bench_dof.py [--layers 30] [--heads 9] [--samples 1024] [--log2-lam 64]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from lit_dof.dof import allocate_feature_dims, degrees_of_freedom, dof_eigvalsh, layer_dof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--log2-lam", type=float, default=64.0)
    args = parser.parse_args()
    L, H, J, d = args.layers, args.heads, args.samples, args.head_dim
    g = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(L, H, J, d, generator=g, dtype=torch.float64), dim=-1)
    # per-layer typical scale plus a heavy tail of large-norm keys, like attention-sink keys
    layer_scale = torch.linspace(40.0, 160.0, L, dtype=torch.float64).view(L, 1, 1)
    norm2_over_s = (layer_scale * torch.rand(L, H, J, generator=g, dtype=torch.float64)).clamp_max(160.0)
    x = directions * torch.sqrt(norm2_over_s * math.sqrt(d)).unsqueeze(-1)

    lam = 2.0**args.log2_lam
    start = time.perf_counter()
    heads = degrees_of_freedom(x, lam)
    seconds = time.perf_counter() - start
    layers = layer_dof(heads)
    dims = allocate_feature_dims(layers, d, "dof", num_samples=J)
    print(
        f"threads={torch.get_num_threads()} torch={torch.__version__} L={L} H={H} J={J} d={d} lam=2^{args.log2_lam:g}"
    )
    print(
        f"layer DoF min/mean/max = {layers.min():.1f} / {layers.mean():.1f} / {layers.max():.1f}; "
        f"dims {min(dims)}…{max(dims)} (sum {sum(dims)})"
    )
    plain = dof_eigvalsh(x[:, 0][:: max(1, L // 5)], lam)
    gap = (plain - heads[:, 0][:: max(1, L // 5)]).abs()
    print(f"plain float64 eigvalsh vs factorised, first head of {gap.numel()} layers: max |ΔN| = {gap.max():.1f}")
    print(f"dof_seconds_{L}x{H}_J{J}={seconds:.2f}")


if __name__ == "__main__":
    main()
