"""Benchmark: the layer-wise step of a ``lit-dof fit`` — seconds per step and peak resident memory — for the
working tree against an earlier revision, in one run of this script, on the same machine.

Each side runs ``python -m lit_dof fit`` (the quickstart config by default; ``--args`` appends
overrides) in its own process for ``--steps`` layer-wise steps (no end-to-end tail, no validation), with a
timing callback from this file. The revision side runs from a ``git worktree`` of ``--before`` with that
tree first on ``PYTHONPATH`` (the child prints which ``lit_dof`` it imported). The sides alternate
``--repeats`` times (A B A B …) so that drift in the machine's load falls on both. Per side it prints the
median seconds per step over the steps after ``--warmup``, the process's peak RSS (bytes; teacher load and
DoF estimate included) and how much the layer-wise steps raised that peak; then the ratios before/after.
The last line is ``step_time_ratio=<before/after> peak_rss_ratio=<before/after>``.

Usage: python scripts/bench_layerwise_step.py --before 0845b09^ [--config configs/quickstart.yaml]
       [--steps 8] [--warmup 2] [--repeats 2] [--args --data.init_args.batch_size=2 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

REPO = Path(__file__).resolve().parents[1]


class StepTimer(L.Callback):
    """Writes the seconds of every training step (batch start to batch end, optimizer step included) and the
    process's peak RSS before the first and after the last step to ``out`` (JSON) when training ends.

    Args:
        out: the JSON file to write.
    """

    def __init__(self, out: str) -> None:
        self.out, self.seconds, self._start, self._peak_before = out, [], 0.0, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._peak_before is None:
            self._peak_before = _peak_rss_bytes()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seconds.append(time.perf_counter() - self._start)

    def on_train_end(self, trainer, pl_module) -> None:
        import lit_dof

        record = {"seconds": self.seconds, "peak_before": self._peak_before, "peak_after": _peak_rss_bytes(),
                  "lit_dof": str(Path(lit_dof.__file__).parent)}  # fmt: skip  # compact dict
        Path(self.out).write_text(json.dumps(record))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _run(tree: Path, args: argparse.Namespace, out: Path) -> dict:
    callback = json.dumps({"class_path": "bench_layerwise_step.StepTimer", "init_args": {"out": str(out)}})
    command = [sys.executable, "-m", "lit_dof", "fit", "--config", str(tree / args.config),
               f"--trainer.max_steps={args.steps}", "--trainer.limit_val_batches=0",
               "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false", "--trainer.logger=false",
               f"--trainer.callbacks=[{callback}]", "--model.init_args.finetune_fraction=0",
               f"--model.init_args.export_dir={out.parent / 'student'}", *args.args]  # fmt: skip  # compact list
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(REPO / "scripts"), os.environ.get("PYTHONPATH", "")]),
    }
    with open(out.parent / "fit.log", "w") as log:
        code = subprocess.run(
            command, env=env, cwd=out.parent, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    if code != 0:
        sys.exit(f"the fit from {tree} failed with code {code}:\n" + (out.parent / "fit.log").read_text()[-3000:])
    record = json.loads(out.read_text())
    if Path(record["lit_dof"]).resolve() != (tree / "lit_dof").resolve():
        raise RuntimeError(f"the child imported lit_dof from {record['lit_dof']}, not {tree}: check PYTHONPATH")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision to compare the working tree against")
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--args", nargs=argparse.REMAINDER, default=[], help="extra fit arguments (last)")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    with tempfile.TemporaryDirectory(prefix="bench_layerwise_") as scratch:
        before_tree = Path(scratch) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before_tree), args.before],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip  # packed args
        try:
            results: dict[str, list[dict]] = {"before": [], "after": []}
            for repeat in range(args.repeats):
                for side, tree in (("before", before_tree), ("after", REPO)):
                    folder = Path(scratch) / f"{side}{repeat}"
                    folder.mkdir()
                    results[side].append(_run(tree, args, folder / "steps.json"))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before_tree)], check=False)
    summary = {}
    for side, runs in results.items():
        steps = [s for run in runs for s in run["seconds"][args.warmup :]]
        summary[side] = {
            "step": statistics.median(steps),
            "peak": max(r["peak_after"] for r in runs),
            "raised": max(r["peak_after"] - r["peak_before"] for r in runs),
        }
        print(
            f"{side:>6} ({args.before if side == 'before' else 'working tree'}): {summary[side]['step']:.3f} s/step "
            f"(median of {len(steps)}), peak RSS {summary[side]['peak'] / 2**30:.2f} GiB, raised by the steps "
            f"{summary[side]['raised'] / 2**30:.2f} GiB"
        )
    step_ratio = summary["before"]["step"] / summary["after"]["step"]
    rss_ratio = summary["before"]["peak"] / summary["after"]["peak"]
    print(f"step_time_ratio={step_ratio:.3f} peak_rss_ratio={rss_ratio:.3f}")


if __name__ == "__main__":
    main()
