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
    """Put a NaN into the first trainable gradient after the backward of optimizer step ``step`` (on rank ``rank``
    only, or on every rank)."""

    def __init__(self, step: int = 1, rank: int | None = None) -> None:
        self.step, self.rank = step, rank

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self.step or self.rank not in (None, trainer.global_rank):
            return
        name, param = next((n, p) for n, p in pl_module.named_parameters() if p.grad is not None)
        grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
        grad.view(-1)[0] = float("nan")
        SEEN.update(name=name, param=param, before=param.detach().clone())


def test_a_nan_gradient_stops_the_fit_before_the_update(tmp_path):
    SEEN.clear()
    poison = f"--trainer.callbacks+={__name__}.PoisonGradient"
    with pytest.raises(FloatingPointError, match=r"non-finite gradients at optimizer step 1 \(training\)") as error:
        build_cli(fit_args(tmp_path, steps=3, extra=[poison]))
    assert "1 of " in str(error.value) and SEEN["name"].removeprefix("student.") in str(error.value)
    torch.testing.assert_close(SEEN["param"].detach(), SEEN["before"], rtol=0, atol=0)  # the step was not taken
    assert torch.isfinite(SEEN["param"]).all()


@pytest.mark.parametrize("strategy", ["ddp_lora", "fsdp2_lora"])
def test_a_nan_gradient_on_one_rank_stops_every_rank(tmp_path, strategy):
    """Under DDP and the shipped FSDP2 config with the LoRA tail, a NaN on rank 1 alone in a tail step: both ranks
    refuse the step and the run ends, no rank left waiting. Under DDP the gradients were all-reduced before the NaN
    came, so rank 0 names the other rank; under FSDP2 the replicated twins' all-reduce comes after it and spreads it,
    so rank 0 names the same parameter."""
    from tests.pipeline.test_distributed import _fit

    poison = [f"--trainer.callbacks+={__name__}.PoisonGradient"]
    poison += ["--trainer.callbacks.init_args.step=2", "--trainer.callbacks.init_args.rank=1"]
    done = _fit(tmp_path, strategy, extra=poison, steps=3, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    message = "FloatingPointError: non-finite gradients at optimizer step 2 (end-to-end tail) in "
    rank0 = "another rank's gradients" if strategy == "ddp_lora" else "1 of "
    assert f"[rank1]: {message}1 of " in output, output[-3000:]
    assert f"[rank0]: {message}{rank0}" in output, output[-3000:]


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
