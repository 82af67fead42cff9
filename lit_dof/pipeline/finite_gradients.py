"""Refuse an optimizer step whose gradients are not finite, before it writes NaN into the weights.

A training step can return a finite loss and still produce NaN or ±inf gradients: a backward that overflows
(1/x² of a tiny normaliser, a product of huge factors) leaves inf that a later ``inf − inf`` turns into NaN. The
optimizer then writes NaN into every parameter those gradients reach, the next forward fails far from the cause,
and a checkpoint written after that step keeps the poisoned weights. :class:`FiniteGradients` (always present in
``lit-dof fit``, the ``finite_gradients:`` group) checks the gradients of every parameter the optimizer updates at
``on_before_optimizer_step`` — one reduction per parameter and one host sync per step; under a data-parallel or
sharded strategy each rank checks its own (local) gradients and all ranks decide together, so every rank stops —
and raises, naming the step, the phase and the parameters, while the weights are still those of the step before.
Under ``16-mixed`` the gradient scaler owns non-finite gradients (it skips such steps and lowers its scale), so
nothing is checked there.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor


class FiniteGradients(L.Callback):
    """Raise before an optimizer step whose gradients hold NaN or ±inf (module docstring).

    Args:
        enabled: False leaves the check out (the step then updates with whatever the gradients hold).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Check the gradients this step would apply.

        Raises:
            FloatingPointError: some parameter's gradient is not finite on some rank; the message names the step,
                the phase, the first parameters of this rank and the next steps (``--trainer.detect_anomaly true``
                from the last checkpoint names the backward that made them; lower learning rates).
        """
        if not self.enabled or getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        local = [_local(p.grad) for p in params]
        finite = torch.stack([torch.isfinite(g).all() for g in local]).all() if local else torch.tensor(True)
        ok = bool(finite)
        if trainer.world_size > 1:
            ok = trainer.strategy.reduce_boolean_decision(ok, all=True)
        if ok:
            return
        names = {id(p): name for name, p in pl_module.named_parameters()}
        bad = [names.get(id(p), "?") for p, g in zip(params, local) if not bool(torch.isfinite(g).all())]
        phase = "end-to-end tail" if getattr(pl_module, "in_finetune", lambda: False)() else "training"
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        where = f"{len(bad)} of {len(params)} parameters on this rank ({shown})" if bad else "another rank's gradients"
        raise FloatingPointError(
            f"non-finite gradients at optimizer step {trainer.global_step} ({phase}) in {where}; the step was not "
            "taken, so the weights and the last checkpoint hold no NaN. Resume from the last checkpoint with "
            "--trainer.detect_anomaly true to name the backward that made them, or lower the learning rates "
            "(finetune_lr_ratio in the tail); --finite_gradients.enabled false takes the step anyway"
        )


def _local(grad: Tensor) -> Tensor:
    """This rank's part of a gradient (a sharded ``DTensor``'s local shard, else the tensor itself)."""
    return grad.to_local() if hasattr(grad, "to_local") else grad
