"""generate(): linear layers decode from a constant-size recurrent state and give the same greedy tokens
as re-running the full parallel forward every step (teacher families and the real SmolLM2)."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF, PerformerFeatureMap
from lit_dof.students import RecurrentStateLayer, linearize
from lit_dof.teacher.families import attention_layers
from tests.conftest import padded_batch, tiny_model, wikipedia_ids
from tests.doubles import install_exact_twins


@torch.no_grad()
def greedy_by_reforward(model, ids, steps, attention_mask=None):
    """Reference: append argmax of a full, cache-free forward ``steps`` times (EOS suppressed, as
    ``generate(min_new_tokens=steps)`` does)."""
    mask = attention_mask
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    for _ in range(steps):
        # generate() derives positions from the mask (left padding): do the same.
        positions = None if mask is None else (mask.cumsum(-1) - 1).clamp_min(0)
        logits = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits[:, -1].clone()
        logits[:, eos] = float("-inf")
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


@pytest.mark.parametrize("softmax_layers", [(), (1,)])
def test_generate_equals_reforward_tiny(family, softmax_layers):
    teacher = tiny_model(family)
    student = linearize(teacher, PerformerFeatureMap, 12, softmax_layers=softmax_layers)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    out = student.generate(ids, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 24), rtol=0, atol=0)


def test_generate_left_padded_batch_equals_reforward():
    student = linearize(tiny_model("llama"), LearnedPRF, 16, softmax_layers=[2])
    ids, mask = padded_batch(lengths=(10, 6, 8))
    out = student.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 16, mask), rtol=0, atol=0)


def test_exact_twins_generate_like_teacher():
    """The cache plumbing (prefill + decode positions, masks) is exact: exact twins decode as the teacher."""
    teacher = tiny_model("qwen2")
    ids = torch.randint(3, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    expected = teacher.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    student = linearize(teacher, LearnedPRF, 8)
    install_exact_twins(student)
    torch.testing.assert_close(student.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False), expected)


@torch.no_grad()
def test_recurrent_state_is_constant_in_context_length():
    student = linearize(tiny_model("llama"), LearnedPRF, [8, 16, 4], softmax_layers=[1])
    cache = student.new_cache()
    assert [type(layer).__name__ for layer in cache.layers] == [
        "RecurrentStateLayer",
        "DynamicLayer",
        "RecurrentStateLayer",
    ]
    ids = torch.randint(3, 97, (2, 40))
    student(ids[:, :10], cache=cache, use_cache=True)
    sizes_10 = [layer.nbytes for layer in cache.layers if isinstance(layer, RecurrentStateLayer)]
    for t in range(10, 40):
        student(ids[:, t : t + 1], cache=cache, use_cache=True)
    sizes_40 = [layer.nbytes for layer in cache.layers if isinstance(layer, RecurrentStateLayer)]
    assert sizes_10 == sizes_40 == [2 * 2 * 8 * (16 + 2) * 4, 2 * 2 * 4 * (16 + 2) * 4]  # B·Hk·M·(D+2) floats
    assert cache.get_seq_length() == 40 and cache.layers[1].keys.shape[2] == 40


def test_cropping_a_recurrent_state_is_refused():
    layer = RecurrentStateLayer()
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        layer.crop(-2)


@pytest.mark.slow
@pytest.mark.parametrize("softmax_layers", [(), (0, 5)], ids=["linear", "hybrid-0-5"])
def test_generate_64_tokens_smollm2(smollm2_dir, softmax_layers):
    from lit_dof.teacher.loading import load_teacher

    teacher, tokenizer = load_teacher(str(smollm2_dir))
    student = linearize(teacher, LearnedPRF, 64, softmax_layers=softmax_layers)
    assert sum(student.linear_layers) == len(attention_layers(teacher)) - len(softmax_layers)
    ids = wikipedia_ids(tokenizer, 1, 24)
    out = student.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
    assert out.shape[1] == 24 + 64
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 64), rtol=0, atol=0)
