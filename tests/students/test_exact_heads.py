"""Students with exact KV heads: every head exact is the teacher (logits, padded batches, generation; Gemma 3's query
scaling included); a mix decodes like its re-forward and survives save/load; ``with_exact_heads`` and its errors;
a fit with ``model.init_args.exact_heads`` exports a student whose listed heads are exact."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.students import linearize, load_student
from lit_dof.students.surgery import exact_heads, resolve_feature_dims, with_exact_heads
from tests.conftest import padded_batch, tiny_model
from tests.students.test_generation import greedy_by_reforward

WINDOW = SlidingWindow(window=4, sink_tokens=1)


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3_text"])
def test_a_student_whose_every_head_is_exact_is_the_teacher(family):
    teacher = tiny_model(family)
    layers = teacher.config.num_hidden_layers
    every = {i: list(range(teacher.config.num_key_value_heads)) for i in range(layers)}
    student = linearize(tiny_model(family), LearnedPRF, 8, sliding_window=WINDOW, exact_heads=every).eval()
    linear = [i for i, twin in student.linear_modules().items()]  # gemma3_text: its global layers only
    assert linear and exact_heads(student.model) == {i: every[i] for i in linear}
    ids, mask = padded_batch()
    valid = mask.bool()
    expected = teacher(ids, attention_mask=mask).logits
    torch.testing.assert_close(student(ids, attention_mask=mask).logits[valid], expected[valid], rtol=1e-4, atol=1e-4)
    prompt = ids[:1, -8:]
    out = student.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert torch.equal(out, teacher.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False))


@torch.no_grad()
def test_a_student_with_some_exact_heads_decodes_like_its_reforward_and_reloads(tmp_path):
    student = linearize(
        tiny_model("llama"), LearnedPRF, [8, [4, 8], 12], sliding_window=WINDOW, exact_heads={0: [1], 1: [0]}
    ).eval()
    assert student.feature_dims == [[8, 0], [0, 8], 12]
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(4))
    out = student.generate(ids, max_new_tokens=14, min_new_tokens=14, do_sample=False)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 14), rtol=0, atol=0)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert loaded.feature_dims == student.feature_dims and exact_heads(loaded.model) == {0: [1], 1: [0]}
    torch.testing.assert_close(loaded(ids).logits, student(ids).logits)


def test_with_exact_heads_zeroes_the_listed_heads_and_names_bad_ones():
    dims = [8, [4, 12], 16]
    assert with_exact_heads(dims, {0: [1], 1: [0, 1]}, [2, 2, 2]) == [[8, 0], [0, 0], 16]
    assert dims == [8, [4, 12], 16]  # not changed in place
    assert resolve_feature_dims([[0, 4], 8], 2) == [[0, 4], 8]
    with pytest.raises(ValueError, match="KV heads in 0..1"):
        with_exact_heads(dims, {0: [2]}, [2, 2, 2])
    with pytest.raises(ValueError, match=r"layer 3, outside the teacher's 0..2.*exact_heads=\{\}.*RetrievalHeads"):
        with_exact_heads(dims, {3: [0]}, [2, 2, 2])  # one teacher's heads on a smaller teacher: the probe is the fix
    with pytest.raises(ValueError, match="feature dim of layer 1 must be a positive integer"):
        resolve_feature_dims([8, 0], 2)  # a whole layer exact is a softmax layer: softmax_layers says so


GATED_CUT = [
    "--model.init_args.sliding_window.far_decay=128",
    "--model.init_args.sliding_window.far_gate=true",
    "--model.init_args.window_dropout.rate=1.0",
    "--model.init_args.window_dropout.window=2",
]  # every layer-wise step cut to a 2-token window


@pytest.mark.parametrize("more", [[], GATED_CUT], ids=["plain", "gated-window-dropout"])
def test_a_fit_with_exact_heads_exports_them(tmp_path, more):
    """Also with a gated far memory and every layer-wise step's window cut (window dropout): the recipe of
    ``quickstart_heads_gate_dropout`` in configs/compare/rows.yaml."""
    from tests.pipeline.test_cli import _run

    extra = ["--model.init_args.exact_heads={1: [0]}", *more]
    cli, log_dir = _run(tmp_path, "methods/swa_sink_linear.yaml", steps=2, extra=extra)
    student = load_student(log_dir / "student")
    assert exact_heads(student.model) == {1: [0]} and student.feature_dims[1][0] == 0
    assert all(isinstance(m, int) for i, m in enumerate(student.feature_dims) if i != 1)
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])
    gated = {type(m).__name__: m.far_gated for m in student.model.modules() if hasattr(m, "far_gated")}
    assert gated and all(gated[name] == bool(more) for name in gated if name != "ExactAttention")
