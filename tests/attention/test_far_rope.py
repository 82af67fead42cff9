"""A far term on un-rotated queries and keys (``SlidingWindow(far_rope=False)``): ``unrotate`` inverts transformers'
own RoPE (full and partial rotary), the student through the model and the layer-wise loss on a capture are then
invariant to shifting every position id (the window is relative, the far term position-free), decoding from the
state equals re-running the parallel forward, and what cannot work is refused."""

from __future__ import annotations

import importlib

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.ops.linear.state import EMPTY_LOG_SCALE
from lit_dof.attention.ops.rotary import rotary_from_angles, rotation_angles, unrotate
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from lit_dof.students import linearize, load_student
from lit_dof.students.layer_losses import SoftmaxRowLoss
from lit_dof.teacher.capture import capture_attention
from tests.conftest import tiny_model
from tests.students.test_generation import greedy_by_reforward

OPTIONS = SlidingWindow(window=4, sink_tokens=1, far_rope=False)


def _student(family="llama", options=OPTIONS, seed=0):
    student = linearize(tiny_model(family), LearnedPRF, 8, sliding_window=options, seed=seed).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for twin in student.linear_modules().values():
            twin.log_mix.copy_(torch.randn(twin.log_mix.shape, generator=g))
    return student


@pytest.mark.parametrize("family", ["llama", "gpt_neox"], ids=["full-rotary", "partial-rotary"])
def test_unrotate_inverts_transformers_rope(family):
    model = tiny_model(family)
    modeling = importlib.import_module(type(model).__module__)
    x = torch.randn(2, 4, 9, model.config.hidden_size // model.config.num_attention_heads, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [200, 3, 17, 5, 90, 91, 92, 250, 1]])
    cos, sin = model.get_decoder().rotary_emb(x.float(), positions)
    assert (cos.shape[-1] < x.shape[-1]) == (family == "gpt_neox")  # partial rotary rotates fewer dims
    rotated, _ = modeling.apply_rotary_pos_emb(x, x, cos.double(), sin.double())
    assert not torch.allclose(rotated, x)
    torch.testing.assert_close(unrotate(rotated, (cos.double(), sin.double())), x, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="rotary cos/sin"):
        unrotate(rotated[:, :, :5], (cos, sin))
    packed = rotation_angles((1.3 * cos, 1.3 * sin))  # what a decoding state keeps, with a YaRN-like scale
    assert packed.shape == (2, 9, cos.shape[-1] // 2 + 1)
    for rebuilt, original in zip(rotary_from_angles(packed), (1.3 * cos, 1.3 * sin)):
        torch.testing.assert_close(rebuilt, original, rtol=0, atol=1e-6)


def test_decoding_keeps_the_window_keys_angles_not_their_features():
    """Between calls a far term on un-rotated keys keeps each window key's rotation (r/2 + 1 numbers), not its
    log-features (M per map head): they are recomputed when the key leaves the window, and decoding token by token
    from that state equals one pass, per-row positions and a rotary scale included."""
    torch.manual_seed(0)
    B, Hq, Hk, d, T, w = 2, 4, 2, 8, 13, 3
    fm = LearnedPRF(d, Hk, 6, seed=1)
    layer = SlidingWindowLinearAttention(
        fm, Hq, Hk, sliding_window=SlidingWindow(window=w, sink_tokens=1, far_rope=False)
    )
    q, k, v = torch.randn(B, Hq, T, d), torch.randn(B, Hk, T, d), torch.randn(B, Hk, T, 3)
    angle = torch.rand(B, T, d // 2) * 6.0
    rotary = (1.3 * torch.cat([angle.cos()] * 2, -1), 1.3 * torch.cat([angle.sin()] * 2, -1))

    def at(start: int, stop: int):  # the rotary of positions start … stop − 1
        return rotary[0][:, start:stop], rotary[1][:, start:stop]

    whole, _ = layer(q, k, v, rotary=rotary)
    y, state = layer(q[:, :, :7], k[:, :, :7], v[:, :, :7], rotary=at(0, 7))
    steps = [y]
    for t in range(7, T):
        assert state.log_phi_k is None and state.rotary.shape == (B, w, d // 2 + 1)
        held = unrotate(state.keys, at(t - w, t))  # the window's keys, un-rotated by their own cos/sin
        torch.testing.assert_close(layer.window_log_features(state), fm.log_features(held), rtol=1e-5, atol=1e-5)
        oldest = layer.window_log_features(state, leaving=1)  # what one decoded token moves out: the others empty
        torch.testing.assert_close(oldest[:, :, :1], fm.log_features(held)[:, :, :1], rtol=1e-5, atol=1e-5)
        assert bool((oldest[:, :, 1:] == EMPTY_LOG_SCALE).all())
        y, state = layer(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state, rotary=at(t, t + 1))
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 2), whole, rtol=1e-5, atol=1e-5)
    features = B * Hk * w * fm.feature_dim * 4  # what the log-features took
    assert state.rotary.numel() * 4 == B * w * (d // 2 + 1) * 4 < features
    rope = SlidingWindowLinearAttention(fm, Hq, Hk, sliding_window=SlidingWindow(window=w, sink_tokens=1))
    _, state = rope(q, k, v)
    assert state.log_phi_k is None and state.rotary is None  # post-RoPE features: the keys alone suffice


def test_layer_matches_the_reference_on_unrotated_features():
    torch.manual_seed(0)
    Hq, Hk, d, T = 4, 2, 8, 13
    fm = LearnedPRF(d, Hk, 6, seed=1)
    layer = SlidingWindowLinearAttention(
        fm, Hq, Hk, sliding_window=SlidingWindow(window=3, far_rope=False), chunk_size=4
    )
    q, k, v = torch.randn(1, Hq, T, d), torch.randn(1, Hk, T, d), torch.randn(1, Hk, T, 3)
    angle = torch.rand(1, T, d // 2) * 6.0
    rotary = (torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1))
    y, _ = layer(q, k, v, rotary=rotary)
    q0, k0 = unrotate(q, rotary), unrotate(k, rotary)
    lq = fm.log_features(q0.reshape(1, Hk, 2 * T, d)).view(1, Hq, T, -1)
    ref = naive_sliding_window_attention(q, k, v, lq, fm.log_features(k0), window=3, log_mix=layer.log_mix)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    rotated_features, _ = SlidingWindowLinearAttention(fm, Hq, Hk, sliding_window=SlidingWindow(window=3))(q, k, v)
    assert not torch.allclose(y, rotated_features, atol=1e-4)  # the far term did change
    with pytest.raises(ValueError, match="needs the rotary"):
        layer(q, k, v)
    with pytest.raises(ValueError, match="prefix keys"):
        layer(q[:, :, 5:], k, v, rotary=(rotary[0][:, 5:], rotary[1][:, 5:]))


@torch.no_grad()
def test_student_is_invariant_to_shifting_positions():
    ids = torch.randint(3, 97, (2, 30), generator=torch.Generator().manual_seed(0))
    logits = {}
    for far_rope in (False, True):
        student = _student(options=SlidingWindow(window=4, sink_tokens=1, far_rope=far_rope))
        for shift in (0, 150):
            positions = (torch.arange(30) + shift).expand_as(ids)
            logits[far_rope, shift] = student(ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(logits[False, 150], logits[False, 0], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits[True, 150], logits[True, 0], atol=1e-3)  # post-RoPE maps see the shift


def test_layerwise_loss_reads_the_captured_rotary():
    """The softmax layer loss on the teacher's capture at shifted positions equals the unshifted one (the teacher's
    rows are relative, the far term sees the capture's un-rotated q/k); without the capture's rotary it refuses."""
    student = _student()
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    losses, captures = {}, {}
    for shift in (0, 100):
        with torch.no_grad(), student.teacher_mode(), capture_attention(student.model, captures.__setitem__):
            student(ids, position_ids=(torch.arange(24) + shift).expand_as(ids), use_cache=False)
        assert captures[0].rotary is not None and captures[0].rotary[0].shape[-2] == 24
        twins = student.linear_modules()
        losses[shift] = torch.stack([SoftmaxRowLoss()(twins[i], captures[i]) for i in sorted(twins)])
    torch.testing.assert_close(losses[100], losses[0], rtol=1e-4, atol=1e-5)
    assert bool((losses[0] > 0).all())
    with pytest.raises(ValueError, match="needs the rotary"):
        SoftmaxRowLoss()(twins[0], captures[0].__class__(captures[0].q, captures[0].k, None, None, None))


def test_generate_equals_reforward_and_the_option_round_trips(tmp_path):
    student = _student(seed=2)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    out = student.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 16), rtol=0, atol=0)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert SlidingWindow.from_dict(loaded.config.window_options) == OPTIONS
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, student(ids).logits)


def test_refused_without_rotary_positions_and_inert_without_a_far_term():
    with pytest.raises(ValueError, match="has none"):
        linearize(tiny_model("gpt2"), LearnedPRF, 8, sliding_window=OPTIONS)
    fm = LearnedPRF(8, 2, 4)
    alone = SlidingWindowLinearAttention(
        fm, 4, 2, sliding_window=SlidingWindow(window=3, far_term=False, far_rope=False)
    )
    assert not alone.needs_rotary
    q, k, v = torch.randn(1, 4, 7, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 3)
    control = SlidingWindowLinearAttention(fm, 4, 2, sliding_window=SlidingWindow(window=3, far_term=False))
    torch.testing.assert_close(alone(q, k, v)[0], control(q, k, v)[0], rtol=0, atol=0)
