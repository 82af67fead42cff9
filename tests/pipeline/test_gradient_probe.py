"""tools/gradient_probe.py, the callback that locates a backward's first overflow (docs/results/gpu): on a tiny fit
it prints every step's trainable gradients and, in the end-to-end tail, the maximum |gradient| at every decoder
layer's output, attention and MLP; an inf put into one layer's output gradient is named as the first (and the step
is then refused, :class:`~lit_dof.pipeline.finite_gradients.FiniteGradients`)."""

from __future__ import annotations

import math
import re

import lightning as L
import pytest
import torch

from lit_dof.pipeline.cli import build_cli
from tests.conftest import REPO
from tests.pipeline.conftest import fit_args


class InfAfterTheLastLayer(L.Callback):
    """From optimizer step 2 on, the gradient leaving the final norm (into the last decoder layer) holds an inf."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layer = pl_module.student.model.model.norm

        def poison(module, args, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if trainer.global_step >= 2 and tensor.requires_grad:
                tensor.register_hook(lambda g: g.clone().index_fill_(-1, torch.tensor([0]), math.inf))

        layer.register_forward_hook(poison)


def test_the_probe_prints_per_layer_gradients_and_names_the_first_overflow(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    extra = [
        "--trainer.callbacks+=gradient_probe.GradientProbe",
        f"--trainer.callbacks+={__name__}.InfAfterTheLastLayer",
    ]
    with pytest.raises(FloatingPointError, match=r"step 2 \(end-to-end tail\)"):  # the probe prints first
        build_cli(fit_args(tmp_path, "methods/lora.yaml", steps=3, extra=extra))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("probe")]
    steps = [line for line in lines if line.startswith("probe step=")]
    assert [s.split()[1:3] for s in steps] == [["step=0", "layer-wise"], ["step=1", "layer-wise"], ["step=2", "tail"]]
    tail = lines[lines.index(steps[-1]) :]
    first = next(line for line in tail if "first non-finite" in line)
    assert first.endswith(": layer1"), first  # the last layer's output: reached before its MLP, attention, layer 0
    cells = dict(re.findall(r"(\d+):(\S+)", next(line for line in tail if "log10 max|grad|" in line)))
    assert set(cells) == {"0", "1"}
    assert all(value in ("inf", "nan") for cell in cells.values() for value in cell.split("/"))
    assert "nonfinite_grads=0/" in steps[0]
