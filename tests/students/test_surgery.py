"""Surgery on every supported family: exact twins reproduce the teacher, linear twins match the naive
reference on the teacher's own q/k/v, layers switch back and forth, bad inputs are named."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF, PerformerFeatureMap, naive_linear_attention
from lit_dof.students import linearize
from lit_dof.teacher.capture import capture_batch
from lit_dof.teacher.families import UnsupportedModelError, attention_layers
from tests.conftest import padded_batch, tiny_model
from tests.doubles import install_exact_twins


def _dims(model, m=8):
    return [m] * len(attention_layers(model))


@pytest.mark.parametrize("side", ["left", "right"])
def test_exact_twins_reproduce_teacher_logits(family, side):
    """With an exact softmax double in every twin, the linearised model is the teacher (rtol 1e-3)."""
    teacher = tiny_model(family)
    ids, mask = padded_batch(side=side)
    with torch.no_grad():
        reference = teacher(ids, attention_mask=mask).logits
        # Attention is far from uniform here, so RoPE/mask/scaling errors would show.
        _, captured = capture_batch(teacher, ids[:1])
        row_max = torch.softmax(
            captured[0].q
            @ captured[0].k.repeat_interleave(captured[0].q.shape[1] // captured[0].k.shape[1], 1).transpose(-1, -2)
            / captured[0].q.shape[-1] ** 0.5,
            -1,
        ).amax(-1)
        assert row_max[..., 4:].mean() > 0.3
    student = linearize(teacher, LearnedPRF, _dims(teacher))
    install_exact_twins(student)
    with torch.no_grad():
        out = student(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(out[valid], reference[valid], rtol=1e-3, atol=1e-4)


def test_linear_layers_match_naive_reference(family):
    """Each linear layer's output equals naive linear attention on that layer's q/k/v (incl. GQA, padding)."""
    teacher = tiny_model(family)
    student = linearize(teacher, LearnedPRF, [4, 12, 8, 16][: len(attention_layers(teacher))])
    ids, mask = padded_batch()
    _, captured = capture_batch(student, {"input_ids": ids, "attention_mask": mask}, values=True, outputs=True)
    twins = student.linear_modules()
    assert twins, "no linear layers"
    for index, lin in twins.items():
        c = captured[index]
        fm = lin.feature_map
        log_q = fm.log_features(c.q.reshape(c.q.shape[0], c.k.shape[1], -1, c.q.shape[-1])).reshape(*c.q.shape[:3], -1)
        log_k = fm.log_features(c.k)
        log_k = log_k.masked_fill(~mask.bool()[:, None, :, None], float("-inf"))
        expected = naive_linear_attention(log_q, log_k, c.v)  # (B, Hq, T, D)
        got = c.out.transpose(1, 2)
        valid = mask.bool()
        torch.testing.assert_close(
            got.permute(0, 2, 1, 3)[valid], expected.permute(0, 2, 1, 3)[valid].to(got.dtype), rtol=2e-4, atol=2e-5
        )


def test_sliding_window_layers_stay_softmax():
    teacher = tiny_model("gemma3_text")
    student = linearize(teacher, PerformerFeatureMap, 8)
    assert student.linear_layers == [False, True, False, True]
    assert sorted(student.linear_modules()) == [1, 3]


def test_switch_layers_back_and_forth_without_reloading():
    teacher = tiny_model("llama")
    ids = torch.randint(3, 97, (2, 16))
    with torch.no_grad():
        reference = teacher(ids).logits.clone()
    student = linearize(teacher, LearnedPRF, 8)
    with torch.no_grad():
        linear = student(ids).logits.clone()
        assert not torch.allclose(linear, reference, atol=1e-3)
        student.set_softmax_layers(range(3))
        assert student.linear_layers == [False, False, False]
        torch.testing.assert_close(student(ids).logits, reference, rtol=0, atol=0)
        student.set_softmax_layers([1])
        assert student.linear_layers == [True, False, True]
        student.set_softmax_layers([])
        torch.testing.assert_close(student(ids).logits, linear, rtol=0, atol=0)
    assert student.config.softmax_layers == []


def test_feature_map_factory_controls_heads_and_dims():
    teacher = tiny_model("llama")  # 4 query heads, 2 KV heads, d = 16
    student = linearize(teacher, LearnedPRF, [5, 6, 7])
    fms = [lin.feature_map for lin in student.linear_modules().values()]
    assert [fm.feature_dim for fm in fms] == [5, 6, 7]
    assert {fm.num_heads for fm in fms} == {2} and {fm.head_dim for fm in fms} == {16}
    per_query = linearize(tiny_model("llama"), LearnedPRF, 4, share_kv_maps=False)
    assert {lin.feature_map.num_heads for lin in per_query.linear_modules().values()} == {4}
    # only feature-map parameters are new
    new = {n for n, _ in student.named_parameters() if ".lit_dof." in n}
    assert new and all(n.split(".")[-1] in ("z", "log_alpha") for n in new)


@pytest.mark.parametrize(
    "dims, match", [(0, "positive integer"), ([8, -1, 8], "layer 1"), ([8, 8], "3 attention layers")]
)
def test_bad_feature_dims_are_named(dims, match):
    with pytest.raises(ValueError, match=match):
        linearize(tiny_model("llama"), LearnedPRF, dims)


def test_softmax_layer_index_out_of_range():
    with pytest.raises(ValueError, match="outside 0..2"):
        linearize(tiny_model("llama"), LearnedPRF, 8, softmax_layers=[3])


def test_unsupported_model_names_class_and_families():
    from transformers import BertConfig, BertLMHeadModel

    model = BertLMHeadModel(
        BertConfig(
            vocab_size=50,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            is_decoder=True,
        )
    )
    with pytest.raises(UnsupportedModelError, match=r"BertLMHeadModel.*Supported families: llama.*gpt2.*gpt_neox"):
        linearize(model, LearnedPRF, 8)


def test_seeded_twins_ignore_the_global_rng():
    """With a seed, each layer's initial features come from (seed, layer): the same whatever the process drew
    before (ranks of a distributed fit), distinct across layers and seeds; the caller's RNG stream is kept."""

    def z(seed, draws):
        teacher = tiny_model("llama")
        torch.manual_seed(draws)
        torch.rand(draws)  # a rank that consumed other random numbers before linearize
        student = linearize(teacher, LearnedPRF, _dims(teacher), seed=seed)
        return [m.feature_map.z for m in student.linear_modules().values()]

    a, b, other = z(0, 3), z(0, 11), z(1, 3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], other[0])
    teacher = tiny_model("llama")
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    linearize(teacher, LearnedPRF, 8, seed=0)
    assert torch.equal(torch.rand(4), expected)
