"""One parameter selection for every training phase (``lit_dof.students.trainable``), by module identity."""

from __future__ import annotations

import pytest

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.students import linearize
from lit_dof.students.trainable import trainable_parameters
from lit_dof.teacher.families import attention_layers
from tests.conftest import tiny_model


def _ids(pairs) -> set[int]:
    return {id(p) for _, p in pairs}


def test_a_teacher_trains_all_or_its_attention_blocks_and_has_no_feature_maps():
    teacher = tiny_model("llama")
    assert _ids(trainable_parameters(teacher, "all")) == {id(p) for p in teacher.parameters()}
    blocks = [layer.module for layer in attention_layers(teacher)]
    assert _ids(trainable_parameters(teacher, "attention")) == {id(p) for b in blocks for p in b.parameters()}
    assert trainable_parameters(teacher, "feature_maps") == []


def test_a_hybrid_trains_the_twins_or_the_attention_of_its_linear_layers_only():
    student = linearize(tiny_model("llama"), LearnedPRF, 8, softmax_layers=[1], seed=0)
    twins = student.linear_modules()
    assert sorted(twins) == [0, 1, 2]  # layer 1 keeps its twin while it runs softmax
    twin_ids = {id(p) for t in twins.values() for p in t.parameters()}
    assert _ids(trainable_parameters(student, "feature_maps")) == twin_ids
    blocks = {layer.index: layer.module for layer in attention_layers(student.model)}
    expected = {id(p) for i in (0, 2) for p in blocks[i].parameters()}  # the twins inside included
    assert _ids(trainable_parameters(student, "attention")) == expected
    assert not expected & {id(p) for p in blocks[1].parameters()}
    names = [n for n, _ in trainable_parameters(student, "all")]
    assert names == [n for n, _ in student.named_parameters()]  # named_parameters order


def test_window_only_twins_have_nothing_to_train_and_bad_choices_are_refused():
    student = linearize(
        tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(window=4, far_term=False), seed=0
    )
    assert trainable_parameters(student, "feature_maps") == []
    with pytest.raises(ValueError, match="trainable must be one of 'all', 'attention', 'feature_maps'"):
        trainable_parameters(student, "everything")
