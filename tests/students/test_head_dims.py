"""Per-head feature dims end to end: the allocation's closed form, students with one M per KV head that
decode like their parallel forward, save/load, keep Σ M state bytes, and a ``dof_head`` fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.dof import allocate_head_feature_dims
from lit_dof.students import RecurrentStateLayer, linearize, load_student
from tests.conftest import tiny_model
from tests.students.test_generation import greedy_by_reforward


def test_allocation_is_the_proportional_rule_over_every_map():
    # 2 layers × 4 query heads, maps shared by pairs of heads: a map's DoF is the max of its pair
    head_dof = [[1.0, 3.0, 2.0, 2.0], [8.0, 0.5, 4.0, 6.0]]
    dims = allocate_head_feature_dims(head_dof, 16, heads_per_map=2)
    per_map = [3.0, 2.0, 8.0, 6.0]
    mean = sum(per_map) / 4
    assert dims == [[round(16 * 3 / mean), round(16 * 2 / mean)], [round(16 * 8 / mean), round(16 * 6 / mean)]]
    tiles = allocate_head_feature_dims(head_dof, 16, heads_per_map=2, multiple_of=8)
    assert all(m % 8 == 0 for row in tiles for m in row) and sum(map(sum, tiles)) == 4 * 16
    with pytest.raises(ValueError, match="multiple of heads_per_map"):
        allocate_head_feature_dims([[1.0, 2.0, 3.0]], 16, heads_per_map=2)


@pytest.mark.parametrize("window", [0, 4])
def test_student_with_per_head_dims_generates_like_reforward(window):
    model = tiny_model("llama")  # 3 layers, 4 query heads, 2 KV heads
    dims = [[8, 16], 12, [4, 4]]
    student = linearize(model, LearnedPRF, dims, sliding_window=SlidingWindow(window=window))
    twins = student.linear_modules()
    assert isinstance(twins[0], HeadGroupedAttention) and not isinstance(twins[1], HeadGroupedAttention)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(4))
    out = student.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 16), rtol=0, atol=0)


@torch.no_grad()
def test_state_bytes_follow_the_sum_of_head_dims_and_survive_save_load(tmp_path):
    student = linearize(tiny_model("llama"), LearnedPRF, [[8, 16], 12, [4, 4]])
    cache = student.new_cache()
    ids = torch.randint(3, 97, (2, 20))
    student(ids, cache=cache, use_cache=True)
    D = student.config.text_config.head_dim
    sizes = [layer.nbytes for layer in cache.layers if isinstance(layer, RecurrentStateLayer)]
    assert sizes == [2 * m * (D + 2) * 4 for m in (8 + 16, 2 * 12, 4 + 4)]  # B · Σ_h M_h · (D + 2) floats
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert loaded.feature_dims == [[8, 16], 12, [4, 4]]
    torch.testing.assert_close(loaded(ids).logits, student(ids).logits)


def test_dof_head_fit_allocates_one_dim_per_kv_head(tmp_path):
    from tests.pipeline.test_cli import _run

    cli, log_dir = _run(tmp_path, "methods/dof_head.yaml", steps=2)
    report = json.loads((log_dir / "dof.json").read_text())
    student = load_student(Path(log_dir) / "student")
    expected = allocate_head_feature_dims(report["head_dof"], 16, heads_per_map=2, multiple_of=8, min_dim=8)
    assert student.feature_dims == expected  # the planner's settings: multiple_of 8, the quickstart's min_dim 8
    assert len(report["allocations"]["dof_head"]) == 2  # dof.json records the plain per-head allocation too
    assert all(isinstance(m, list) and len(m) == 4 and all(x % 8 == 0 for x in m) for m in student.feature_dims)
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])
