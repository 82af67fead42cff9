"""Measure one ``lit-dof fit``: tokens/s of its training steps and its peak memory, beside ``lit-dof plan``'s estimate.

Runs ``lit-dof plan`` and then ``lit-dof fit`` with the same arguments in this process, and reports:

* ``tokens_per_sec``: tokens read by the training steps per second of training time, from the run's
  ``metrics.jsonl`` (Lightning's ``ThroughputMonitor``: ``train/lengths`` and ``train/time``), between its first
  and its last logged point — the steps up to the first (compilation, allocator warm-up) left out; the DoF plan
  and loading are outside training time. The fit's config must have a ``ThroughputMonitor`` (the quickstart and
  every trainer config do).
* ``peak_gib``: on CUDA the most memory the fit allocated on the GPU (``torch.cuda.max_memory_allocated``;
  ``reserved_gib`` the caching allocator's reservation), on the CPU the process's peak resident set (host);
  ``plan_gib`` is ``lit-dof plan``'s ``peak_gpu_gib`` (CUDA) or ``host_gib`` (CPU) for the same command line,
  and ``peak/plan`` their ratio.

Prints one line ``fit_check name=… key=value …`` and writes the same as ``OUT/NAME.json``; a fit that raises
still reports what it measured up to then, with ``error`` set, and the script exits 1. GiB = 2³⁰ bytes.

Usage: python scripts/fit_check.py --name NAME [--out DIR] -- FIT_ARGS...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import resource
import sys
import time
from pathlib import Path

import torch

from lit_dof.pipeline.cli import LitDofCLI, build_cli, plan_main
from lit_dof.pipeline.run_files import read_metrics

GIB = 2**30


class _ObservedCLI(LitDofCLI):
    """``lit-dof fit`` that keeps an exception of the run as ``error`` (a one-line message) instead of raising."""

    error: str | None = None

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except Exception as exc:  # noqa: BLE001 - a failed fit still reports what it measured, and the error
            self.error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def plan_peak(fit_args: list[str]) -> dict[str, float]:
    """``lit-dof plan``'s last line for ``fit_args`` as ``{"peak_gpu_gib": x, "host_gib": y}``."""
    with contextlib.redirect_stdout(io.StringIO()):
        text = plan_main(list(fit_args))
    match = re.search(r"plan peak_gpu_gib=([\d.]+) host_gib=([\d.]+)", text.strip().splitlines()[-1])
    if match is None:
        raise RuntimeError(f"lit-dof plan printed no 'plan peak_gpu_gib=… host_gib=…' line:\n{text}")
    return {"peak_gpu_gib": float(match[1]), "host_gib": float(match[2])}


def training_rate(metrics_file: Path) -> dict[str, float]:
    """Tokens per second of training time between the first and last ``ThroughputMonitor`` points."""
    metrics = read_metrics(metrics_file)
    lengths, times = dict(metrics.get("train/lengths", [])), dict(metrics.get("train/time", []))
    steps = sorted(set(lengths) & set(times))
    if len(steps) < 2:
        raise RuntimeError(
            f"{metrics_file} has {len(steps)} ThroughputMonitor point(s) (train/lengths with train/time): run more "
            "steps than the monitor's window_size, or add lightning.pytorch.callbacks.ThroughputMonitor"
        )
    first, last = steps[0], steps[-1]
    seconds = times[last] - times[first]
    return {
        "tokens_per_sec": (lengths[last] - lengths[first]) / seconds,
        "timed_steps": last - first,
        "timed_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: fit_check.py --name NAME [--out DIR] -- FIT_ARGS...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", default=".", help="folder for NAME.json")
    args, fit_args = parser.parse_args(argv[:split]), argv[split + 1 :]

    planned = plan_peak(fit_args)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    cli = build_cli(["fit", *fit_args], cli_class=_ObservedCLI)
    wall, error = time.perf_counter() - start, cli.error
    record = {"name": args.name, "fit_args": fit_args, "wall_seconds": round(wall, 1), "error": error}
    try:
        record.update(training_rate(Path(cli.trainer.log_dir) / "metrics.jsonl"))
    except (OSError, RuntimeError) as exc:
        record["tokens_per_sec"] = None
        record["error"] = error or str(exc)
    record["steps"] = int(cli.trainer.global_step)
    if cuda:
        record["device"] = torch.cuda.get_device_name()
        record["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        record["reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        record["plan_gib"] = planned["peak_gpu_gib"]
    else:
        record["device"] = "cpu"
        record["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # KiB on Linux
        record["plan_gib"] = planned["host_gib"]
    record["peak/plan"] = record["peak_gib"] / record["plan_gib"] if record["plan_gib"] > 0 else None
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    shown = {k: v for k, v in record.items() if k not in ("fit_args", "name")}
    print(f"fit_check name={args.name} " + " ".join(f"{k}={_fmt(v)}" for k, v in shown.items()), flush=True)
    if record["error"]:
        raise SystemExit(f"fit_check: the fit failed: {record['error']}")
    return record


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value).replace(" ", "_")


if __name__ == "__main__":
    main()
