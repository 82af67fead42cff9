"""prefill_cache_nbytes: a teacher's KV cache grows with the context exactly as the closed form
2·B·H_kv·d·T·bytes per layer; a pure linear student's state is (B, H, M, D) + two (B, H, M) float32 tensors per
layer whatever the context; a sliding-window student's adds a ring buffer of the window that stops growing."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.generation import teacher_kv_nbytes
from lit_dof.students import linearize
from lit_dof.students.cache import prefill_cache_nbytes
from tests.conftest import tiny_model


def test_teacher_kv_cache_grows_as_the_closed_form():
    teacher = tiny_model("llama")
    for context in (5, 40):
        assert prefill_cache_nbytes(teacher, context) == teacher_kv_nbytes(teacher.config, context, torch.float32)


@pytest.mark.parametrize("share_kv_maps", [False, True])
def test_pure_linear_state_is_constant_and_equals_its_shapes(share_kv_maps):
    teacher = tiny_model("llama")
    config = teacher.config
    dims = [8, 16, *[8] * (config.num_hidden_layers - 2)]
    student = linearize(teacher, LearnedPRF, dims, share_kv_maps=share_kv_maps).eval()
    # per layer (1, H, M, D) + (1, H, M) + (1, H, M) float32; H: the KV heads with shared maps, else query heads
    heads = config.num_key_value_heads if share_kv_maps else config.num_attention_heads
    head = config.hidden_size // config.num_attention_heads
    expected = sum(dims) * heads * (head + 2) * 4
    assert [prefill_cache_nbytes(student, context) for context in (3, 17, 50)] == [expected] * 3


def test_sliding_window_state_stops_growing_past_the_window():
    teacher = tiny_model("llama")
    student = linearize(teacher, LearnedPRF, 8, sliding_window=SlidingWindow(window=16, sink_tokens=2)).eval()
    sizes = [prefill_cache_nbytes(student, context) for context in (30, 60, 90)]
    assert sizes[0] == sizes[1] == sizes[2]
    assert sizes[0] < prefill_cache_nbytes(teacher, 90)
    with pytest.raises(ValueError, match="at least 1 token"):
        prefill_cache_nbytes(student, 0)
