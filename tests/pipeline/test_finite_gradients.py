"""A step whose gradients are not finite stops ``lit-dof fit`` before the optimizer writes NaN into the weights
(:class:`~lit_dof.pipeline.finite_gradients.FiniteGradients`, always present): on a GPU a tail step with a finite
loss gave NaN gradients, and the next forward failed far from the cause (docs/results/gpu)."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.finite_gradients import FiniteGradients
from tests.pipeline.conftest import fit_args

SEEN: dict[str, torch.Tensor] = {}
"""What :class:`PoisonGradient` saw: the poisoned parameter's value before the step."""


class PoisonGradient(L.Callback):
    """Put a NaN into the first trainable gradient after the backward of optimizer step ``step``."""

    def __init__(self, step: int = 1) -> None:
        self.step = step

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self.step:
            return
        name, param = next((n, p) for n, p in pl_module.named_parameters() if p.grad is not None)
        param.grad.view(-1)[0] = float("nan")
        SEEN.update(name=name, param=param, before=param.detach().clone())


def test_a_nan_gradient_stops_the_fit_before_the_update(tmp_path):
    SEEN.clear()
    poison = f"--trainer.callbacks+={__name__}.PoisonGradient"
    with pytest.raises(FloatingPointError, match=r"non-finite gradients at optimizer step 1 \(training\)") as error:
        build_cli(fit_args(tmp_path, steps=3, extra=[poison]))
    assert "1 of " in str(error.value) and SEEN["name"].removeprefix("student.") in str(error.value)
    torch.testing.assert_close(SEEN["param"].detach(), SEEN["before"], rtol=0, atol=0)  # the step was not taken
    assert torch.isfinite(SEEN["param"]).all()


def test_disabled_or_under_a_gradient_scaler_the_step_goes_on():
    """``enabled=False`` checks nothing; under ``16-mixed`` the gradient scaler skips such steps itself."""
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.tensor([0.0, float("inf"), 0.0])
    module = torch.nn.Module()
    module.w = param
    optimizer = torch.optim.SGD([param], lr=1.0)
    plain = SimpleNamespace(precision_plugin=SimpleNamespace(), world_size=1, global_step=7)
    scaled = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=object()), world_size=1, global_step=7)
    FiniteGradients(enabled=False).on_before_optimizer_step(plain, module, optimizer)
    FiniteGradients().on_before_optimizer_step(scaled, module, optimizer)
    with pytest.raises(FloatingPointError, match=r"step 7 \(training\) in 1 of 1 parameters on this rank \(w\)"):
        FiniteGradients().on_before_optimizer_step(plain, module, optimizer)
