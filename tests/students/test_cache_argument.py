"""transformers' Cache API as the installed version names it: a student's forward and ``generate``, and the
teacher forward that distillation and validation run (``teacher_mode``), pass the cache under
:data:`~lit_dof.interface.MODEL_CACHE_ARGUMENT` and emit no deprecation warning about ``past_key_values``."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from packaging.version import Version

from lit_dof.attention import LearnedPRF
from lit_dof.interface import MODEL_CACHE_ARGUMENT
from lit_dof.students import RecurrentStateLayer, linearize
from tests.conftest import tiny_model


@pytest.fixture
def student():
    return linearize(tiny_model("llama"), LearnedPRF, 8, softmax_layers=(1,), seed=0).eval()


def _ids(length: int = 9) -> torch.Tensor:
    return torch.randint(3, 97, (2, length), generator=torch.Generator().manual_seed(0))


def test_cache_argument_is_the_installed_transformers_name():
    expected = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"
    assert MODEL_CACHE_ARGUMENT == expected


@torch.no_grad()
def test_no_past_key_values_warning_in_forward_generate_and_teacher_forward(student):
    ids = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        student(ids, use_cache=False)  # training / perplexity
        out = student(ids, use_cache=True)  # a fresh student cache
        cache = getattr(out, MODEL_CACHE_ARGUMENT)
        assert any(isinstance(layer, RecurrentStateLayer) for layer in cache.layers)
        student(ids[:, -1:], cache=cache, use_cache=True)  # one decode step on that cache
        with student.teacher_mode():  # the teacher forward of distillation and validation
            student(ids, use_cache=False)
            student(ids, use_cache=True)
        generated = student.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape == (2, ids.shape[1] + 4)


@torch.no_grad()
def test_cache_and_past_key_values_are_the_same_argument(student):
    ids = _ids()
    first, second = student.new_cache(), student.new_cache()
    student(ids[:, :-1], cache=first, use_cache=True)
    student(ids[:, :-1], past_key_values=second, use_cache=True)  # the name generate used before 5.24
    a = student(ids[:, -1:], cache=first, use_cache=True).logits
    b = student(ids[:, -1:], past_key_values=second, use_cache=True).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, student(ids, use_cache=False).logits[:, -1:], rtol=1e-4, atol=1e-4)
