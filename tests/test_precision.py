"""The precision policy: the float32 region, the upcast, and the dtype a trainer precision implies."""

import pytest
import torch

from lit_dof.precision import fp32_region, precision_dtype, resolve_dtype, upcast


def test_fp32_region_disables_autocast_and_pins_a_half_default_dtype(bf16_default_dtype):
    a, b = torch.randn(4, 5, dtype=torch.float32), torch.randn(5, 3, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16  # what autocast does outside the region
        with fp32_region():
            assert not torch.is_autocast_enabled("cpu") and torch.get_default_dtype() == torch.float32
            torch.testing.assert_close(a @ b, (a.double() @ b.double()).float())  # float32, not bf16
            assert torch.zeros(1).dtype == torch.float32
            with fp32_region():  # nested (the chunked kernel recurses)
                pass
            assert torch.get_default_dtype() == torch.float32
        assert torch.is_autocast_enabled("cpu") and torch.get_default_dtype() == bf16_default_dtype
    with pytest.raises(RuntimeError, match="boom"), fp32_region():
        raise RuntimeError("boom")
    assert torch.get_default_dtype() == bf16_default_dtype  # restored on an exception too


def test_fp32_region_as_decorator_leaves_float64_alone():
    @fp32_region()
    def inside():
        return torch.get_default_dtype(), torch.is_autocast_enabled("cpu")

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert inside() == (torch.float64, False)
    finally:
        torch.set_default_dtype(previous)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert inside() == (torch.float32, False)


def test_upcast():
    assert upcast(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert upcast(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    for dtype in (torch.float32, torch.float64, torch.long, torch.bool):
        x = torch.ones(2, dtype=dtype)
        assert upcast(x) is x


@pytest.mark.parametrize(
    "precision, dtype",
    [("bf16-true", torch.bfloat16), ("16-true", torch.float16), ("bf16-mixed", torch.float32),
     ("16-mixed", torch.float32), ("32-true", torch.float32), (None, torch.float32)],
)  # fmt: skip  # parametrize table
def test_precision_dtype(precision, dtype):
    assert precision_dtype(precision) == dtype
    assert resolve_dtype("auto", precision) == dtype
    assert resolve_dtype("float32", precision) == torch.float32  # an explicit name wins


def test_resolve_dtype_rejects_unknown_names():
    with pytest.raises(ValueError, match="'auto' or one of float32, bfloat16, float16"):
        resolve_dtype("fp8", "32-true")


@pytest.mark.parametrize("precision", ["bf16-true", "16-true", "bf16-mixed", "32-true"])
def test_student_module_teacher_dtype_follows_the_trainer(precision):
    """``teacher_dtype="auto"`` reads ``trainer.precision``; an explicit name is kept; a bad one fails early."""
    import lightning as L

    from lit_dof.pipeline.layerwise import LayerwiseDistillation

    module = LayerwiseDistillation(teacher="unused")
    assert module.resolved_teacher_dtype() == torch.float32  # no trainer yet
    module.trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False, enable_checkpointing=False,
                               enable_progress_bar=False, enable_model_summary=False)  # fmt: skip  # packed args
    assert module.resolved_teacher_dtype() == precision_dtype(precision)
    explicit = LayerwiseDistillation(teacher="unused", teacher_dtype="bfloat16")
    explicit.trainer = module.trainer
    assert explicit.resolved_teacher_dtype() == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be"):
        LayerwiseDistillation(teacher="unused", teacher_dtype="half")
