"""Students on disk: save → load gives identical logits and generated tokens, without the teacher files."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_dof.attention import DiJiangFeatureMap, HedgehogFeatureMap, LearnedPRF, PerformerFeatureMap
from lit_dof.students import LitDofForCausalLM, linearize, load_student
from lit_dof.teacher.loading import load_teacher
from tests.conftest import save_tokenizer, tiny_model


@pytest.mark.parametrize("feature_map", [LearnedPRF, PerformerFeatureMap, DiJiangFeatureMap, HedgehogFeatureMap])
def test_round_trip_after_teacher_files_are_deleted(tmp_path, family, feature_map):
    teacher_dir, student_dir = tmp_path / "teacher", tmp_path / "student"
    tiny_model(family).save_pretrained(teacher_dir)
    save_tokenizer(teacher_dir)
    teacher, _ = load_teacher(str(teacher_dir))
    dims = [6, 10, 7, 9][: teacher.config.num_hidden_layers]
    student = linearize(teacher, feature_map, dims, softmax_layers=[1])
    for lin in student.linear_modules().values():  # make the saved parameters differ from a fresh init
        for p in lin.feature_map.parameters():
            p.data.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(3, 97, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = student(ids).logits
    tokens = student.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    student.save_pretrained(student_dir)
    shutil.rmtree(teacher_dir)

    loaded = load_student(student_dir)
    assert loaded.feature_dims == dims and loaded.config.softmax_layers == [1]
    assert loaded.linear_layers == student.linear_layers
    assert type(next(iter(loaded.linear_modules().values())).feature_map) is feature_map
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, logits, rtol=0, atol=0)
    torch.testing.assert_close(loaded.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False), tokens)

    auto = AutoModelForCausalLM.from_pretrained(student_dir)  # transformers-native registration
    assert isinstance(auto, LitDofForCausalLM)
    with torch.no_grad():
        torch.testing.assert_close(auto(ids).logits, logits, rtol=0, atol=0)


def test_performer_redraw_interval_is_recorded(tmp_path):
    from functools import partial

    student = linearize(tiny_model("llama"), partial(PerformerFeatureMap, redraw_interval=7), 8)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert {lin.feature_map.redraw_interval for lin in loaded.linear_modules().values()} == {7}


def test_save_is_atomic_and_replaces(tmp_path):
    student = linearize(tiny_model("llama"), LearnedPRF, 8)
    target = tmp_path / "s"
    student.save_pretrained(target)
    student.set_softmax_layers([0])
    student.save_pretrained(target)  # overwrite
    assert load_student(target).config.softmax_layers == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temporary leftovers


def test_load_student_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_student(tmp_path)
    tiny_model("llama").save_pretrained(tmp_path / "teacher")
    with pytest.raises(ValueError, match="not a lit-dof student"):
        load_student(tmp_path / "teacher")


@pytest.mark.slow
def test_smollm2_student_round_trip_without_teacher_cache(tmp_path, smollm2_dir):
    """The saved SmolLM2 student works after the (converted) teacher directory is deleted."""
    copy = tmp_path / "teacher"
    shutil.copytree(smollm2_dir, copy)
    teacher, tokenizer = load_teacher(str(copy))
    student = linearize(teacher, LearnedPRF, 64, softmax_layers=[0, 5])
    ids = tokenizer(["The capital of France is", "Linear attention"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = student(**ids).logits
    tokens = student.generate(**ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    student.save_pretrained(tmp_path / "student")
    shutil.rmtree(copy)
    loaded = load_student(tmp_path / "student")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**ids).logits, logits, rtol=0, atol=0)
    torch.testing.assert_close(loaded.generate(**ids, max_new_tokens=16, min_new_tokens=16, do_sample=False), tokens)
