"""Benchmark: chunked linear attention (LearnedPRF map applied) vs softmax SDPA, in one process.

Times, on the current device, for B=1 and a head layout (default H=9, d=64, M=64: SmolLM2's without GQA;
``--shape smollm2`` / ``llama-3-8b`` give those teachers' layouts, GQA included; SDPA gets the KV heads
repeated, so that its flash / memory-efficient kernels run; a case out of device memory or unsupported
prints ``failed`` and why):
  * forward and forward+backward at T ∈ {1024, 4096, 8192, 32768};
  * one decode step with a context of 1k, 8k and 32k tokens (linear: recurrent state update;
    softmax: one query against a KV cache of that length).
``--layer sliding`` times the shipped student's attention instead (exact window ``--window`` + ``--sinks`` sinks
and a decaying linear far term, :class:`~lit_dof.attention.SlidingWindowLinearAttention`; ``--far-gate`` and
``--far-memory delta`` the gated and delta-rule far memories).
Each line prints both times and the ratio sdpa/linear. The last line is ``speedup_fwd_T8192=<ratio>``.

Usage: python scripts/bench_attention.py [--lengths 1024 4096 8192 32768] [--device cpu] [--no-tune-allocator]
       [--shape smollm2|llama-3-8b] [--layer linear|sliding] [--window-kernel torch|flex]
       [--linear-kernel torch|fla] [--far-gate] [--far-memory additive|delta] [--min-time SECONDS]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from lit_dof.attention import (
    CausalLinearAttention,
    LearnedPRF,
    LinearAttentionState,
    SlidingWindow,
    SlidingWindowLinearAttention,
)
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


SHAPES = {"smollm2": (9, 3, 64), "llama-3-8b": (32, 8, 128)}  # (Hq, Hk, d) of the teachers' attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 32768])
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--no-tune-allocator", action="store_true", help="keep glibc's malloc defaults")
    parser.add_argument("--shape", nargs="+", choices=sorted(SHAPES), help="teachers' (Hq, Hk, d); default 9, 9, 64")
    parser.add_argument("--features", type=int, default=64, help="M, features per head")
    parser.add_argument("--layer", choices=["linear", "sliding"], default="linear")
    parser.add_argument("--window", type=int, default=64, help="--layer sliding: exact window w (tokens)")
    parser.add_argument("--sinks", type=int, default=4, help="--layer sliding: sink tokens s")
    parser.add_argument("--window-kernel", choices=["torch", "flex"], default="torch", help="--layer sliding")
    parser.add_argument("--linear-kernel", choices=["torch", "fla"], default="torch", help="--layer sliding")
    parser.add_argument("--far-gate", action="store_true", help="--layer sliding: the far memory's forget gate")
    parser.add_argument("--far-memory", choices=["additive", "delta"], default="additive", help="--layer sliding")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds spent timing each case (at least)")
    args = parser.parse_args()
    tuned = False if args.no_tune_allocator else tune_cpu_allocator()
    for shape in args.shape or [None]:  # every (shape, dtype) in this one process, each printed as one block
        for dtype in args.dtype:
            bench(args, shape, dtype, tuned)


def bench(args: argparse.Namespace, shape: str | None, dtype_name: str, tuned: bool) -> None:
    """Time one head layout in one dtype; prints its block of lines."""
    device, dtype = torch.device(args.device), getattr(torch, dtype_name)
    (H, Hk, d), B, M = SHAPES.get(shape, (9, 9, 64)), 1, args.features
    torch.manual_seed(0)
    if args.layer == "sliding":
        window = SlidingWindow(
            window=args.window,
            sink_tokens=args.sinks,
            far_decay=128.0,
            far_gate=args.far_gate,
            far_memory=args.far_memory,
        )
        layer = SlidingWindowLinearAttention(
            LearnedPRF(d, Hk, M),
            H,
            Hk,
            sliding_window=window,
            window_kernel=args.window_kernel,
            linear_kernel=args.linear_kernel,
        )
    else:
        layer = CausalLinearAttention(LearnedPRF(d, Hk, M), H, Hk, chunk_size=args.chunk_size)
    layer = layer.to(device)
    print(
        f"device={device} dtype={dtype_name} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"allocator_tuned={tuned} B={B} H={H} Hk={Hk} d={d} M={M} chunk={args.chunk_size} layer={args.layer}"
        + (
            f" window={args.window} sinks={args.sinks} kernel={args.window_kernel}+{args.linear_kernel}"
            f" far_gate={args.far_gate} far_memory={args.far_memory}"
            if args.layer == "sliding"
            else ""
        )
    )
    if device.type == "cuda":
        print(f"gpu={torch.cuda.get_device_name(device)}")

    # All forward cases first, then all forward+backward ones: a case's timing should not depend on the heap
    # that an earlier backward left fragmented (glibc; measured: T = 8192 forward 41–44 ms alone, 49 ms after
    # the T = 4096 backward).
    fwd_ratio = {}
    inputs = {T: _qkv(B, H, Hk, T, d, device, dtype) for T in args.lengths}
    for T in args.lengths:
        q, k, v = inputs[T]
        kr, vr = _repeat(k, H), _repeat(v, H)
        with torch.no_grad():
            t_sdpa = _timed(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True), device, args.min_time)
            t_lin = _timed(lambda: layer(q, k, v), device, args.min_time)
        if t_sdpa and t_lin:
            fwd_ratio[T] = t_sdpa / t_lin
        print(f"fwd      T={T:6d}  sdpa={_ms(t_sdpa)}  linear={_ms(t_lin)}  sdpa/linear={_ratio(t_sdpa, t_lin)}")
    for T in args.lengths:
        q, k, v = inputs[T]
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        kr, vr = (_repeat(x, H).requires_grad_() for x in (k, v))

        def sdpa_fb():
            F.scaled_dot_product_attention(qg, kr, vr, is_causal=True).sum().backward()

        def lin_fb():
            layer(qg, kg, vg)[0].sum().backward()

        t_sdpa, t_lin = _timed(sdpa_fb, device, args.min_time), _timed(lin_fb, device, args.min_time)
        print(f"fwd+bwd  T={T:6d}  sdpa={_ms(t_sdpa)}  linear={_ms(t_lin)}  sdpa/linear={_ratio(t_sdpa, t_lin)}")

    step_times = {}
    for ctx in args.decode_contexts:
        q1, k1, v1 = _qkv(B, H, Hk, 1, d, device, dtype)
        _, k_cache, v_cache = _qkv(B, H, Hk, ctx, d, device, dtype)
        k_cache, v_cache = _repeat(k_cache, H), _repeat(v_cache, H)
        with torch.no_grad():
            _, state = layer(*_qkv(B, H, Hk, min(ctx, 256), d, device, dtype))
            if isinstance(state, LinearAttentionState):
                state = LinearAttentionState(state.kv, state.k_sum, state.log_scale)  # same size for any context
            t_sdpa = _timed(lambda: F.scaled_dot_product_attention(q1, k_cache, v_cache), device, 0.3, 200)
            t_lin = _timed(lambda: layer(q1, k1, v1, state), device, 0.3, 200)
        if t_lin:
            step_times[ctx] = t_lin
        print(
            f"decode   ctx={ctx:6d}  sdpa={_us(t_sdpa)}  linear={_us(t_lin)}  sdpa/linear={_ratio(t_sdpa, t_lin)}  "
            f"state_bytes={state.nbytes}"
        )
    if len(step_times) > 1:
        lo, hi = min(step_times), max(step_times)
        print(f"decode_step_ratio_ctx{hi}_vs_ctx{lo}={step_times[hi] / step_times[lo]:.2f}")
    if 8192 in fwd_ratio:
        print(f"speedup_fwd_T8192={fwd_ratio[8192]:.2f}")


def _timed(fn, device: torch.device, min_time: float, max_reps: int = 50) -> float | None:
    """:func:`timeit`, or ``None`` where the case runs out of device memory or is unsupported there (flex
    attention's backward on the CPU); the next case still runs."""
    try:
        return timeit(fn, device, min_time, max_reps)
    except (torch.OutOfMemoryError, NotImplementedError) as exc:
        print(f"  ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return None


def _ms(t: float | None) -> str:
    return f"{t * 1e3:9.2f} ms" if t else "   failed   "


def _us(t: float | None) -> str:
    return f"{t * 1e6:9.1f} us" if t else "   failed   "


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a and b else "   n/a"


def _repeat(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``x`` ``(B, Hk, T, d)`` with each KV head repeated for its query heads: SDPA's flash and memory-efficient
    kernels take no GQA (``enable_gqa`` falls back to the math kernel, which holds T × T scores)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _qkv(B: int, H: int, Hk: int, T: int, d: int, device: torch.device, dtype: torch.dtype):
    """Random ``q (B, H, T, d)``, ``k``, ``v (B, Hk, T, d)``."""
    return tuple(torch.randn(B, h, T, d, device=device, dtype=dtype) for h in (H, Hk, Hk))


if __name__ == "__main__":
    main()
