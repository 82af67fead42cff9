"""The injected layer losses: each class computes what its function computes; legacy strings resolve in one place."""

import pytest
import torch

from lit_dof.attention import CausalLinearAttention, LearnedPRF
from lit_dof.students.layer_losses import (
    LEGACY_LOSS_NAMES,
    KernelL2Loss,
    LayerLoss,
    OutputLoss,
    SoftmaxRowLoss,
    layer_loss_name,
    resolve_layer_loss,
)
from lit_dof.students.losses import attention_distillation_loss, attention_output_loss
from lit_dof.teacher.capture import CapturedAttention


def _inputs(seed=3):
    """A GQA twin and a random capture: q (2, 4, 12, 8), k/v (2, 2, 12, 8), out (2, 12, 4, 8), padding in row 1."""
    torch.manual_seed(seed)
    twin = CausalLinearAttention(LearnedPRF(8, 2, 16, seed=seed), num_heads=4, num_kv_heads=2)
    q, k, v = 1.5 * torch.randn(2, 4, 12, 8), 1.5 * torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    out = torch.randn(2, 12, 4, 8)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, :4] = False
    return twin, CapturedAttention(q=q, k=k, v=v, out=out, key_padding=valid)


@pytest.mark.parametrize("query_rows", [None, 5])
@pytest.mark.parametrize("cls, kind", [(SoftmaxRowLoss, "softmax"), (KernelL2Loss, "l2")])
def test_kernel_loss_objects_equal_the_function(cls, kind, query_rows):
    twin, c = _inputs()
    got = cls()(twin, c, query_rows=query_rows, generator=torch.Generator().manual_seed(11))
    generator = torch.Generator().manual_seed(11)
    want = attention_distillation_loss(
        twin, c.q, c.k, c.key_padding, kind=kind, query_rows=query_rows, generator=generator
    )
    assert got.dtype == torch.float32 and got.ndim == 0 and torch.equal(got, want)
    assert not cls.needs_values and cls.name == kind


def test_output_loss_object_equals_the_function_and_needs_values():
    twin, c = _inputs()
    got = OutputLoss()(twin, c, query_rows=3, generator=torch.Generator())  # all rows whatever query_rows says
    assert torch.equal(got, attention_output_loss(twin, c.q, c.k, c.v, c.out, c.key_padding))
    assert OutputLoss.needs_values and OutputLoss.name == "output"
    with pytest.raises(ValueError, match="needs the captured values"):
        OutputLoss()(twin, CapturedAttention(q=c.q, k=c.k, v=None, out=None, key_padding=None))


def test_legacy_strings_resolve_and_unknown_ones_name_the_choices():
    resolved = {name: type(resolve_layer_loss(name)) for name in ("softmax", "l2", "output")}
    assert resolved == {"softmax": SoftmaxRowLoss, "l2": KernelL2Loss, "output": OutputLoss}
    loss = KernelL2Loss()
    assert resolve_layer_loss(loss) is loss
    for bad in ("kl", "lit_dof.students.layer_losses.Nope", 3):
        with pytest.raises(ValueError, match="'softmax', 'l2', 'output'") as info:
            resolve_layer_loss(bad)
        assert "class_path" in str(info.value) and repr(bad) in str(info.value)


def test_layer_loss_name_reads_every_saved_form():
    path = "lit_dof.students.layer_losses.KernelL2Loss"
    for value in ("l2", path, "KernelL2Loss", {"class_path": path}, KernelL2Loss, KernelL2Loss()):
        assert layer_loss_name(value) == "l2"
    assert layer_loss_name("my.pkg.FancyLoss") == "FancyLoss"
    assert sorted(LEGACY_LOSS_NAMES) == ["l2", "output", "softmax"]


def test_a_subclass_is_named_after_itself_and_must_define_call():
    class Mine(LayerLoss):
        def __call__(self, twin, captured, *, query_rows=None, generator=None):
            return captured.q.sum() * 0

    assert Mine.name == "Mine" and not Mine.needs_values and repr(Mine()) == "Mine()"
    with pytest.raises(TypeError):
        LayerLoss()
