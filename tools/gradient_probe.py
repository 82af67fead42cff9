"""Where does a backward first overflow? A Lightning callback for ``lit-dof fit`` that prints, for every optimizer
step from ``from_step`` on, the trainable gradients that are not finite, the largest |q|/|k| projection outputs,
and the largest |gradient| reaching each decoder layer's output, its attention's and its MLP's, with the first
of them, in the order the backward reaches them, that holds inf or NaN.

It answered: on a GPU a tail step with a finite loss gave NaN gradients in the layers below some layer
(docs/results/gpu/README.md, 2026-11-28); ``--trainer.detect_anomaly true`` names the first backward that returns
NaN (a matmul fed an inf gradient), this names where the inf came from. Run it on the device with
``tools/`` on ``PYTHONPATH``::

    lit-dof fit ... "--trainer.callbacks+=gradient_probe.GradientProbe" \
        --trainer.callbacks.init_args.from_step 30

Each printed line starts with ``probe``.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import Tensor, nn

from lit_dof.hybrid.prefix import decoder_layers


class GradientProbe(L.Callback):
    """Print gradient and activation magnitudes per optimizer step (module docstring).

    Args:
        from_step: the first optimizer step printed (steps before run unhooked).
        anomaly_from: turn on ``torch.autograd.set_detect_anomaly`` from this step (``None``: never); it costs
            several times a step's time, so start it just before the step that fails.
    """

    def __init__(self, from_step: int = 0, anomaly_from: int | None = None) -> None:
        self.from_step, self.anomaly_from = from_step, anomaly_from
        self.grads: dict[str, Tensor] = {}
        self.order: list[str] = []
        self.qk: dict[str, Tensor] = {}
        self.handles: list = []
        self.trainer_active = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Hook the decoder layers, their attention and MLP outputs, and the q/k projections."""
        student = pl_module.student
        layers = decoder_layers(getattr(student, "model", student))
        for index, layer in enumerate(layers):
            for name, module in (("layer", layer), ("attn", layer.self_attn), ("mlp", getattr(layer, "mlp", None))):
                if module is not None:
                    self.handles.append(module.register_forward_hook(self._output_hook(f"{name}{index}")))
            for proj in ("q_proj", "k_proj"):
                module = getattr(layer.self_attn, proj, None)
                if module is not None:
                    self.handles.append(module.register_forward_hook(self._magnitude_hook(f"{proj[0]}{index}")))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()

    def _output_hook(self, name: str):
        def hook(module: nn.Module, args, output) -> None:
            tensor = output[0] if isinstance(output, tuple) else output
            if not (self.trainer_active and isinstance(tensor, Tensor) and tensor.requires_grad):
                return

            def record(grad: Tensor) -> None:
                self.grads[name] = grad.detach().float().abs().amax()
                self.order.append(name)

            tensor.register_hook(record)

        return hook

    def _magnitude_hook(self, name: str):
        def hook(module: nn.Module, args, output: Tensor) -> None:
            if self.trainer_active and isinstance(output, Tensor):
                self.qk[name] = output.detach().float().abs().amax()

        return hook

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        """Clear the step's records; turn anomaly detection on from ``anomaly_from``."""
        self.trainer_active = trainer.global_step >= self.from_step
        self.grads, self.order, self.qk = {}, [], {}
        if self.anomaly_from is not None and trainer.global_step >= self.anomaly_from:
            torch.autograd.set_detect_anomaly(True, check_nan=True)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Print the step's gradients: non-finite trainable ones, the first non-finite output gradient, maxima."""
        if not self.trainer_active:
            return
        names = {id(p): n for n, p in pl_module.named_parameters()}
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        bad = [names.get(id(p), "?") for p in params if not bool(torch.isfinite(p.grad).all())]
        phase = "tail" if getattr(pl_module, "in_finetune", lambda: False)() else "layer-wise"
        print(f"probe step={trainer.global_step} {phase} nonfinite_grads={len(bad)}/{len(params)} {bad[:4]}")
        maxima = {name: float(self.grads[name]) for name in self.order}
        first = next((name for name in self.order if not math.isfinite(maxima[name])), None)
        print(f"probe   first non-finite output gradient (backward order): {first}")
        layers = sorted({int(n.removeprefix("layer")) for n in maxima if n.startswith("layer")})
        cells = [
            f"{i}:" + "/".join(_log10(maxima.get(f"{kind}{i}")) for kind in ("layer", "attn", "mlp")) for i in layers
        ]
        print("probe   log10 max|grad| layer/attn/mlp: " + " ".join(cells))
        if self.qk:
            top = sorted(self.qk.items(), key=lambda item: -float(item[1]))[:4]
            print("probe   max|q|,|k| projections: " + " ".join(f"{n}={float(v):.3g}" for n, v in top))


def _log10(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "inf" if value > 0 else "nan"
    return f"{math.log10(value):.1f}" if value > 0 else "0"
