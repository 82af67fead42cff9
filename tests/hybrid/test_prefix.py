"""Prefix caching: logits computed from the teacher's cached state at depth f equal a full forward of the
hybrid whose layers before f are softmax — for several families."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF
from lit_dof.hybrid.prefix import PrefixCache, decoder_layers, start_at
from lit_dof.students import linearize
from tests.conftest import tiny_config


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "qwen2"])
def test_cached_prefix_matches_full_forward(family):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_config(tiny_config(family)).eval()
    L = len(decoder_layers(teacher))
    student = linearize(teacher, LearnedPRF, 8).eval()
    ids = torch.randint(3, 90, (2, 12))
    batches = [{"input_ids": ids}]
    cache = PrefixCache(student, batches)
    assert len(cache.states[0]) == L + 1
    for first in range(L):
        linear = list(range(first, L))  # layers < first softmax: their outputs are the teacher's
        student.set_softmax_layers([i for i in range(L) if i not in linear])
        with torch.no_grad():
            full = student(ids, use_cache=False).logits
        torch.testing.assert_close(cache.logits(student, 0, first), full, rtol=1e-4, atol=1e-5)
    # the swap is undone: a plain forward is unchanged and every layer is back
    assert all(type(layer).__name__ != "_PassThrough" for layer in decoder_layers(student))
    with pytest.raises(ValueError, match="depth"):
        with start_at(student, L, cache.hidden(0, 0)):
            pass


def test_a_wrong_prefix_is_detected():
    """Guard against a vacuous pass: starting at depth 1 from the *embeddings* changes the logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    ids = torch.randint(3, 90, (1, 10))
    cache = PrefixCache(teacher, [{"input_ids": ids}])
    with torch.no_grad(), start_at(teacher, 1, cache.hidden(0, 0)):
        wrong = teacher(ids).logits
    assert not torch.allclose(wrong, teacher(ids).logits, atol=1e-3)
