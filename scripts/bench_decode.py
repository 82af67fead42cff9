"""Benchmark: one decode step of the whole model at long contexts — the teacher's KV cache against the
students' constant-size states (pure linear attention; sliding window + linear attention), in one process.

For every context L the teacher's cache is filled with L random keys/values per layer (the cost of a decode
step depends on the cache's size, not its content) and the students' states are those after a short real
prefill, advanced to position L; then the median time of one greedy decode step is measured. Each line
prints the step time, tokens/s (batch / step time) and cache bytes of each model and the ratios student/teacher of
tokens/s and teacher/student of bytes per sequence (``--batch`` sequences at once; ``--student-batch`` gives the
students another batch, e.g. one the teacher's cache would not fit). The last line is
``decode_speedup_L<max>=<linear tok/s / teacher tok/s> state_ratio_L<max>=<teacher bytes / linear bytes per sequence>``.

Usage: python scripts/bench_decode.py [--teacher smollm2-135m-instruct] [--contexts 1024 4096 8192 32768]
       [--window 64] [--sinks 4] [--feature-dim 64] [--device cpu] [--dtype bfloat16] [--batch 1]
       [--student-batch 64] [--count-ops]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.cache_utils import DynamicCache

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.interface import MODEL_CACHE_ARGUMENT
from lit_dof.runtime import tune_cpu_allocator
from lit_dof.students import RecurrentStateLayer, linearize
from lit_dof.students.cache import cache_nbytes
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.loading import load_teacher


def _step_seconds(model, cache, position: int, device, reps: int, batch: int = 1) -> float:
    """Median seconds of one decode step at ``position`` (the cache is rolled back after each for the KV cache)."""
    ids = torch.full((batch, 1), 7, device=device)
    positions = torch.full((batch, 1), position, device=device)
    times = []
    with torch.no_grad():
        for _ in range(reps + 1):
            start = time.perf_counter()
            model(ids, **{MODEL_CACHE_ARGUMENT: cache}, position_ids=positions, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if isinstance(cache, DynamicCache) and not any(isinstance(x, RecurrentStateLayer) for x in cache.layers):
                cache.crop(-1)  # back to L keys: every step sees the same context
            else:
                for layer in cache.layers:  # the state's position: each step decodes token L again
                    if isinstance(layer, RecurrentStateLayer):
                        layer.seen = position
                        if hasattr(layer.state, "seen"):
                            layer.state.seen = position
    return statistics.median(times[1:])


def _op_count(model, cache, position: int, device) -> int:
    """Tensor operations (every profiler event, nested ones included) of one decode step at ``position``: the
    launch count that bounds a small model's step on a GPU, independent of the device it is counted on."""
    ids, positions = torch.full((1, 1), 7, device=device), torch.full((1, 1), position, device=device)
    with torch.no_grad(), torch.profiler.profile() as prof:
        model(ids, **{MODEL_CACHE_ARGUMENT: cache}, position_ids=positions, use_cache=True)
    return sum(event.count for event in prof.key_averages())


def _filled_kv_cache(config, length: int, device, dtype, batch: int = 1) -> DynamicCache:
    cache = DynamicCache(config=config)
    hk = config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for i in range(config.num_hidden_layers):
        k = torch.randn(batch, hk, length, d, device=device, dtype=dtype)
        cache.update(k, torch.randn_like(k), i)
    return cache


def _student_state(student, length: int, device, batch: int = 1):
    cache = student.new_cache()
    with torch.no_grad():
        student(torch.randint(3, 1000, (batch, 96), device=device), cache=cache, use_cache=True)
    for layer in cache.layers:
        layer.seen = length
        if hasattr(layer.state, "seen"):
            layer.state.seen = length
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 32768])
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--feature-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together (each at context L)")
    parser.add_argument(
        "--student-batch", type=int, default=None, help="the students' batch (default --batch): room the state frees"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--count-ops", action="store_true", help="also count one step's operations at the first L")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="the teacher weights' dtype"
    )
    args = parser.parse_args()
    device, weights = torch.device(args.device), getattr(torch, args.dtype)
    tuned = tune_cpu_allocator() if device.type == "cpu" else False

    def fresh_teacher():
        return load_teacher(args.teacher, dtype=weights, device=str(device))[0]

    teacher = fresh_teacher()
    config, dtype = teacher.config, next(teacher.parameters()).dtype
    torch.manual_seed(0)
    linear = linearize(fresh_teacher(), LearnedPRF, args.feature_dim).eval()
    options = SlidingWindow(window=args.window, sink_tokens=args.sinks)
    windowed = linearize(fresh_teacher(), LearnedPRF, args.feature_dim, sliding_window=options).eval()
    print(
        f"device={device} threads={torch.get_num_threads()} torch={torch.__version__} allocator_tuned={tuned} "
        f"teacher={args.teacher} layers={config.num_hidden_layers} M={args.feature_dim} window={args.window} "
        f"sinks={args.sinks} dtype={args.dtype}"
    )
    sb = args.student_batch or args.batch
    print(f"batch teacher={args.batch} students={sb} (tok/s = batch / step time; ratios are of tok/s and of bytes)")
    ratios = {}
    for L in args.contexts:
        kv = _filled_kv_cache(config, L, device, dtype, args.batch)
        t_teacher, b_teacher = _step_seconds(teacher, kv, L, device, args.reps, args.batch), cache_nbytes(kv)
        del kv
        rate = args.batch / t_teacher
        line = [f"L={L:6d} teacher {1e3 * t_teacher:8.2f} ms/step {rate:8.1f} tok/s {b_teacher / 2**20:9.2f} MiB"]
        for name, student in (("linear", linear), ("window+linear", windowed)):
            cache = _student_state(student, L, device, sb)
            t, b = _step_seconds(student, cache, L, device, args.reps, sb), cache_nbytes(cache)
            speedup, smaller = sb / t / rate, b_teacher * sb / (b * args.batch)  # tok/s ratio; bytes per sequence
            line.append(
                f"{name} {1e3 * t:7.2f} ms {sb / t:8.1f} tok/s {b / 2**20:7.2f} MiB (speedup {speedup:5.2f}x, "
                f"cache / {smaller:7.1f})"
            )
            ratios.setdefault(L, (speedup, smaller))  # the pure linear student's
        print(" | ".join(line), flush=True)
    if args.count_ops:
        L = args.contexts[0]
        counts = [_op_count(teacher, _filled_kv_cache(config, L, device, dtype), L, device)]
        counts += [_op_count(m, _student_state(m, L, device), L, device) for m in (linear, windowed)]
        print(f"ops per decode step at L={L}: teacher {counts[0]} linear {counts[1]} window+linear {counts[2]}")
    top = max(ratios)
    print(f"decode_speedup_L{top}={ratios[top][0]:.2f} state_ratio_L{top}={ratios[top][1]:.1f}")


if __name__ == "__main__":
    main()
