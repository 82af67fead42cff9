"""``position_shift``: training sequences start at random absolute positions. Under rotary positions the
teacher's outputs must not change (its attention depends on relative positions only) while the post-RoPE
queries/keys the feature maps see do; a teacher with absolute positions is refused."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import SlidingWindow
from lit_dof.pipeline.layerwise import LayerwiseDistillation
from lit_dof.pipeline.planner import FixedPlanner
from lit_dof.pipeline.teacher_reuse import ReusedCapture
from tests.conftest import save_tokenizer, tiny_model


def _module(tmp_path, family="llama", shift=100, seq_len=16, **kwargs):
    model = tiny_model(family)
    model.save_pretrained(tmp_path / family)
    save_tokenizer(tmp_path / family)
    module = LayerwiseDistillation(
        teacher=str(tmp_path / family), planner=FixedPlanner(8), seq_len=seq_len, position_shift=shift, seed=0, **kwargs
    )
    return module


def test_shifted_positions_leave_the_teacher_and_rotate_what_the_feature_maps_see(tmp_path):
    module = _module(tmp_path, sliding_window=SlidingWindow(window=4, sink_tokens=1))
    module.configure_model()
    ids = torch.randint(3, 97, (3, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids}
    positions = module._position_ids(batch, batch_idx=0)
    assert positions.shape == (3, 16)
    offsets = positions[:, :1]
    assert torch.equal(positions, torch.arange(16) + offsets)  # each row: consecutive positions from its offset
    assert ((offsets >= 0) & (offsets <= 100)).all() and offsets.unique().numel() > 1
    assert torch.equal(positions, module._position_ids(batch, batch_idx=0))  # the step's seed: a resume redraws them

    plain_logits, plain = module._teacher_forward(batch, capture=True)
    shifted_logits, shifted = module._teacher_forward(batch, capture=True, positions=positions)
    torch.testing.assert_close(shifted_logits, plain_logits, rtol=1e-4, atol=1e-4)  # relative positions only
    for index in plain:
        q0, k0, q1, k1 = plain[index].q, plain[index].k, shifted[index].q, shifted[index].k
        assert not torch.allclose(q1, q0, atol=1e-3)  # the absolute rotation the maps see has moved …
        scores0 = q0 @ k0.repeat_interleave(q0.shape[1] // k0.shape[1], dim=1).transpose(-1, -2)
        scores1 = q1 @ k1.repeat_interleave(q1.shape[1] // k1.shape[1], dim=1).transpose(-1, -2)
        torch.testing.assert_close(scores1, scores0, rtol=1e-4, atol=1e-4)  # … the kernel's arguments have not

    # The step trains the maps on the shifted q/k: its gradients differ from the unshifted step's.
    def gradients(shift):
        module.position_shift = shift
        module.student.zero_grad(set_to_none=True)
        module._reuse = ReusedCapture(module.teacher_reuse)
        loss = module.training_step(batch, 0)
        loss.backward()
        return torch.cat([p.grad.flatten() for _, p in module.trainable_parameters() if p.grad is not None])

    module.log = lambda *a, **k: None
    assert not torch.allclose(gradients(100), gradients(0))


def test_padded_rows_count_positions_over_their_attended_tokens(tmp_path):
    module = _module(tmp_path)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = module._position_ids({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": mask}, 3)
    offsets = positions[:, 2:3] - torch.tensor([[0], [2]])
    assert torch.equal(positions[0, 2:], torch.arange(3) + offsets[0])
    assert torch.equal(positions[1], torch.arange(5) + offsets[1])


def test_no_shift_keeps_the_models_own_positions(tmp_path):
    assert _module(tmp_path, shift=0)._position_ids({"input_ids": torch.ones(1, 4, dtype=torch.long)}, 0) is None


def test_bad_position_shifts_are_refused_before_the_twins_are_built(tmp_path):
    with pytest.raises(ValueError, match="position_shift must be an integer >= 0 or 'auto'"):
        LayerwiseDistillation(position_shift=-1)
    with pytest.raises(ValueError, match="absolute position embeddings"):
        _module(tmp_path, family="gpt2").configure_model()
    module = _module(tmp_path, shift=250, seq_len=16)  # the tiny configs stop at 256 positions
    with pytest.raises(ValueError, match=r"max_position_embeddings \(256\): set position_shift <= 240"):
        module.configure_model()
    assert module.student is None


def test_auto_covers_the_teachers_positions_or_turns_itself_off(tmp_path):
    module = _module(tmp_path, shift="auto", seq_len=16)
    module.configure_model()
    assert module.position_shift == 256 - 16  # the tiny llama config: 256 positions
    module = _module(tmp_path, family="gpt2", shift="auto")
    module.configure_model()  # absolute positions: no shift, no error
    assert module.position_shift == 0
