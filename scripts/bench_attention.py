"""Benchmark: chunked linear attention (LearnedPRF map applied) vs softmax SDPA, in one process.

Times, on the current device, for B=1, H=9, d=64, M=64 (SmolLM2's head layout without GQA):
  * forward and forward+backward at T ∈ {1024, 4096, 8192, 32768};
  * one decode step with a context of 1k, 8k and 32k tokens (linear: recurrent state update;
    softmax: one query against a KV cache of that length).
Each line prints both times and the ratio sdpa/linear. The last line is ``speedup_fwd_T8192=<ratio>``.

Usage: python scripts/bench_attention.py [--lengths 1024 4096 8192 32768] [--device cpu] [--no-tune-allocator]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from lit_dof.attention import CausalLinearAttention, LearnedPRF, LinearAttentionState
from lit_dof.runtime import tune_cpu_allocator


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, device: torch.device, min_time: float = 1.0, max_reps: int = 50) -> float:
    """Median seconds per call of ``fn`` after one warm-up call, repeating until ``min_time`` is spent."""
    fn()
    _sync(device)
    times: list[float] = []
    while len(times) < max_reps and (sum(times) < min_time or len(times) < 3):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
        if times[-1] > min_time:  # one slow call is enough
            break
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 32768])
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-tune-allocator", action="store_true", help="keep glibc's malloc defaults")
    args = parser.parse_args()

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    tuned = False if args.no_tune_allocator else tune_cpu_allocator()
    B, H, d, M = 1, 9, 64, 64
    torch.manual_seed(0)
    layer = CausalLinearAttention(LearnedPRF(d, H, M), H, chunk_size=args.chunk_size).to(device)
    print(
        f"device={device} dtype={args.dtype} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"allocator_tuned={tuned} B={B} H={H} d={d} M={M} chunk={args.chunk_size}"
    )

    # All forward cases first, then all forward+backward ones: a case's timing should not depend on the heap
    # that an earlier backward left fragmented (glibc; measured: T = 8192 forward 41–44 ms alone, 49 ms after
    # the T = 4096 backward).
    fwd_ratio = {}
    inputs = {T: tuple(torch.randn(B, H, T, d, device=device, dtype=dtype) for _ in range(3)) for T in args.lengths}
    for T in args.lengths:
        q, k, v = inputs[T]
        with torch.no_grad():
            t_sdpa = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)
            t_lin = timeit(lambda: layer(q, k, v), device)
        fwd_ratio[T] = t_sdpa / t_lin
        print(
            f"fwd      T={T:6d}  sdpa={t_sdpa * 1e3:9.2f} ms  linear={t_lin * 1e3:8.2f} ms  "
            f"sdpa/linear={fwd_ratio[T]:6.2f}"
        )
    for T in args.lengths:
        qg, kg, vg = (x.clone().requires_grad_() for x in inputs[T])

        def sdpa_fb():
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).sum().backward()

        def lin_fb():
            layer(qg, kg, vg)[0].sum().backward()

        t_sdpa, t_lin = timeit(sdpa_fb, device), timeit(lin_fb, device)
        print(
            f"fwd+bwd  T={T:6d}  sdpa={t_sdpa * 1e3:9.2f} ms  linear={t_lin * 1e3:8.2f} ms  "
            f"sdpa/linear={t_sdpa / t_lin:6.2f}"
        )

    step_times = {}
    for ctx in args.decode_contexts:
        q1, k1, v1 = (torch.randn(B, H, 1, d, device=device, dtype=dtype) for _ in range(3))
        k_cache, v_cache = (torch.randn(B, H, ctx, d, device=device, dtype=dtype) for _ in range(2))
        with torch.no_grad():
            _, state = layer(*(torch.randn(B, H, min(ctx, 256), d, device=device, dtype=dtype) for _ in range(3)))
            state = LinearAttentionState(state.kv, state.k_sum, state.log_scale)  # same size for any context
            t_sdpa = timeit(
                lambda: F.scaled_dot_product_attention(q1, k_cache, v_cache), device, min_time=0.3, max_reps=200
            )
            t_lin = timeit(lambda: layer(q1, k1, v1, state), device, min_time=0.3, max_reps=200)
        step_times[ctx] = t_lin
        print(
            f"decode   ctx={ctx:6d}  sdpa={t_sdpa * 1e6:9.1f} us  linear={t_lin * 1e6:8.1f} us  "
            f"sdpa/linear={t_sdpa / t_lin:6.2f}  state_bytes={state.nbytes}"
        )
    if len(step_times) > 1:
        lo, hi = min(step_times), max(step_times)
        print(f"decode_step_ratio_ctx{hi}_vs_ctx{lo}={step_times[hi] / step_times[lo]:.2f}")
    if 8192 in fwd_ratio:
        print(f"speedup_fwd_T8192={fwd_ratio[8192]:.2f}")


if __name__ == "__main__":
    main()
