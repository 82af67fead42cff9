"""Measure the host memory of a few real ``lit-dof fit`` training steps on CPU (run as a subprocess).

    python -m tests.pipeline.memory_probe OUT.json <lit-dof fit arguments>

Writes ``{"baseline", "train_start", "peak"}``: resident set size (bytes) after the imports, when training
starts (teacher, twins and data loaded), and the peak resident set size over the steps after the first one
(the first creates Adam's state): the kernel's high-water mark ``VmHWM``, reset through
``/proc/self/clear_refs`` when the first step ends, so neither the teacher's load nor the imports count.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import lightning as L


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class PeakRSS(L.Callback):
    """Resets the high-water mark after the first training batch and reads it at the end of training."""

    def __init__(self) -> None:
        self.train_start = self.peak = 0

    def on_train_start(self, trainer, pl_module) -> None:
        gc.collect()
        self.train_start = _status("VmRSS")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 0:
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        else:
            self.peak = max(self.peak, _status("VmHWM"))


class RankPeakRSS(L.Callback):
    """Each rank writes ``<out_dir>/rss_rank<r>.json``: its resident set size's high-water mark (``VmHWM``, bytes,
    since the process started: imports, teacher load, sharding, DoF estimate) when training starts and when
    ``fit`` ends (export included), and ``VmRSS`` at both points. For ``lit-dof fit --trainer.callbacks+=``.

    Args:
        out_dir: the folder to write to (created).
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir, self.record = Path(out_dir), {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.record.update(train_start_hwm=_status("VmHWM"), train_start_rss=_status("VmRSS"))

    def on_fit_end(self, trainer, pl_module) -> None:
        self.record.update(end_hwm=_status("VmHWM"), end_rss=_status("VmRSS"))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rss_rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


def main(out: str, args: list[str]) -> None:
    import torch  # noqa: F401  (the imports the measured run needs, before the baseline)
    import transformers  # noqa: F401

    from lit_dof.pipeline.cli import build_cli

    gc.collect()
    baseline = _status("VmRSS")
    cli = build_cli(args, run=False)
    probe = PeakRSS()
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    Path(out).write_text(json.dumps({"baseline": baseline, "train_start": probe.train_start, "peak": probe.peak}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
