"""LoRA through peft: adapters leave the teacher untouched, change the student, merge exactly into plain
weights, and the merged student saves and loads without peft."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.students import linearize, load_student
from lit_dof.students.lora import LoRA, adapters_enabled, add_lora, merged_state_dict, set_adapters_enabled
from tests.conftest import tiny_model


def _student_with_trained_lora(seed=0):
    student = linearize(tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(window=4))
    names = add_lora(student.model, LoRA(rank=2, alpha=4.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in student.model.named_parameters():
            if ".lora_B." in name:  # B starts at 0 (no change); give it a value as training would
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return student, names


@torch.no_grad()
def test_adapters_change_the_student_but_not_its_teacher():
    teacher = tiny_model("llama")
    ids = torch.randint(3, 97, (2, 11))
    reference = teacher(ids).logits
    student, names = _student_with_trained_lora()
    assert names and all(".lora_" in n for n in names)
    assert {n.split(".")[-4] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    trainable = {n: p.requires_grad for n, p in student.named_parameters()}
    with student.teacher_mode():
        torch.testing.assert_close(student(ids).logits, reference)  # adapters off: the frozen teacher
        with student.teacher_mode():  # nested: still the teacher after the inner block
            pass
        assert not adapters_enabled(student.model)
        torch.testing.assert_close(student(ids).logits, reference)
    assert adapters_enabled(student.model)  # back on after the outer block
    assert {n: p.requires_grad for n, p in student.named_parameters()} == trainable  # untouched by the switch
    adapted = student(ids).logits
    set_adapters_enabled(student.model, False)
    plain = student(ids).logits
    set_adapters_enabled(student.model, True)
    torch.testing.assert_close(student(ids).logits, adapted)
    assert not torch.allclose(adapted, plain)


@torch.no_grad()
def test_merged_weights_are_exact_and_the_saved_student_needs_no_peft(tmp_path):
    student, _ = _student_with_trained_lora(seed=1)
    ids = torch.randint(3, 97, (1, 13))
    before = student(ids).logits
    merged = merged_state_dict(student)
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    assert adapters_enabled(student.model)  # the live model keeps its adapters
    student.save_pretrained(tmp_path / "s", state_dict=merged)
    loaded = load_student(tmp_path / "s")
    assert all(type(m) is nn.Linear for n, m in loaded.named_modules() if n.endswith(("q_proj", "o_proj")))
    torch.testing.assert_close(loaded(ids).logits, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(student(ids).logits, before)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rank"):
        LoRA(rank=0)
    with pytest.raises(ValueError, match="dropout"):
        LoRA(dropout=1.0)


def test_lora_under_ddp_needs_unused_parameters_allowed():
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    from lit_dof.pipeline.layerwise import LayerwiseDistillation

    module = LayerwiseDistillation(lora=LoRA())
    module._trainer = SimpleNamespace(strategy=DDPStrategy(find_unused_parameters=False))
    with pytest.raises(ValueError, match="find_unused_parameters"):
        module._check_lora_strategy()
    module._trainer = SimpleNamespace(strategy=DDPStrategy(find_unused_parameters=True))
    module._check_lora_strategy()


def test_targets_missing_from_the_teacher_are_refused_by_name():
    """The quickstart's q/k/v/o targets on a Llama pass; on GPT-2 (c_attn, Conv1D) they are refused by name,
    and GPT-2's own target passes."""
    from lit_dof.students.lora import check_targets

    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    check_targets(llama, LoRA())
    check_targets(llama, LoRA(target_modules=["self_attn.q_proj"]))  # peft's dotted suffix
    check_targets(gpt2, LoRA(target_modules=["c_attn"]))
    with pytest.raises(ValueError, match=r"\['q_proj', 'k_proj', 'v_proj', 'o_proj'\] match no module.*c_attn"):
        check_targets(gpt2, LoRA())
    with pytest.raises(ValueError, match=r"\['c_attn'\] match no module.*lora=null"):
        check_targets(llama, LoRA(target_modules=["q_proj", "c_attn"]))


def test_adapters_stay_float32_master_weights_on_a_bf16_teacher():
    """On a bf16 teacher (and after Lightning's bf16-true conversion, ``.to(bfloat16)``) the adapters stay float32;
    the forward keeps the base layer's bf16 output, and equals the float32 computation of W x + (α/r)·B A x to
    bf16 rounding."""
    model = tiny_model("llama").to(torch.bfloat16)
    names = add_lora(model, LoRA(rank=2, alpha=4.0))
    model.to(torch.bfloat16)
    adapters = dict(model.named_parameters())
    assert names and all(adapters[n].dtype == torch.float32 for n in names)
    q = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        q.lora_B["default"].weight.normal_()
        x = torch.randn(3, q.in_features).to(torch.bfloat16)
        out = q(x)
        a, b = q.lora_A["default"].weight, q.lora_B["default"].weight
        reference = x.float() @ q.base_layer.weight.float().T + 2.0 * (x.float() @ a.T) @ b.T
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
