"""Students with sliding-window + linear attention: the layer against the float64 reference through a real
model's q/k/v, greedy decoding from the constant-size state equal to re-running the parallel forward, and a
save/load round trip that keeps the window, the sinks and the learned mixing weights."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention import (
    HedgehogFeatureMap,
    LearnedPRF,
    PerformerFeatureMap,
    SlidingWindow,
    SlidingWindowLinearAttention,
)
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from lit_dof.students import RecurrentStateLayer, linearize, load_student
from tests.conftest import padded_batch, tiny_model
from tests.students.test_generation import greedy_by_reforward


def _perturb_mix(student, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for twin in student.linear_modules().values():
            if twin.log_mix is not None:
                twin.log_mix.copy_(torch.randn(twin.log_mix.shape, generator=g))


@pytest.mark.parametrize("share_kv_maps", [True, False], ids=["shared", "per-query-head"])
def test_layer_matches_reference(share_kv_maps):
    torch.manual_seed(0)
    Hq, Hk, d, T = 4, 2, 8, 23
    fm = LearnedPRF(d, Hk if share_kv_maps else Hq, 6, seed=1)
    layer = SlidingWindowLinearAttention(
        fm, Hq, Hk, sliding_window=SlidingWindow(window=5, sink_tokens=2), chunk_size=8
    )
    with torch.no_grad():
        layer.log_mix.normal_()
    q, k, v = torch.randn(1, Hq, T, d), torch.randn(1, Hk, T, d), torch.randn(1, Hk, T, 3)
    y, _ = layer(q, k, v)
    kk = k if share_kv_maps else k.repeat_interleave(2, 1)
    vv = v if share_kv_maps else v.repeat_interleave(2, 1)
    if share_kv_maps:
        lq = fm.log_features(q.reshape(1, Hk, 2 * T, d)).view(1, Hq, T, -1)
    else:
        lq = fm.log_features(q)
    ref = naive_sliding_window_attention(
        q, kk, vv, lq, fm.log_features(kk), window=5, sink_tokens=2, log_mix=layer.log_mix
    )
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "feature_map,window,sinks",
    [(LearnedPRF, 4, 0), (LearnedPRF, 3, 2), (HedgehogFeatureMap, 5, 1), (PerformerFeatureMap, 1, 1)],
    ids=["prf-w4", "prf-w3-s2", "hedgehog-w5-s1", "performer-w1-s1"],
)
def test_generate_equals_reforward(family, feature_map, window, sinks):
    student = linearize(
        tiny_model(family), feature_map, 12, sliding_window=SlidingWindow(window=window, sink_tokens=sinks)
    )
    _perturb_mix(student)
    ids = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(1))
    out = student.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 20), rtol=0, atol=0)


def test_hybrid_left_padded_batch_generates_like_reforward():
    student = linearize(
        tiny_model("llama"), LearnedPRF, 16, softmax_layers=[2], sliding_window=SlidingWindow(window=4, sink_tokens=1)
    )
    _perturb_mix(student, seed=2)
    ids, mask = padded_batch(lengths=(10, 6, 8))
    out = student.generate(ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    torch.testing.assert_close(out, greedy_by_reforward(student, ids, 12, mask), rtol=0, atol=0)


@torch.no_grad()
def test_decode_state_is_constant_in_context_length():
    student = linearize(tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(window=6, sink_tokens=2))
    cache = student.new_cache()
    ids = torch.randint(3, 97, (2, 60))
    student(ids[:, :10], cache=cache, use_cache=True)
    sizes = set()
    for t in range(10, 60):
        student(ids[:, t : t + 1], cache=cache, use_cache=True)
        sizes.add(tuple(layer.nbytes for layer in cache.layers if isinstance(layer, RecurrentStateLayer)))
    assert len(sizes) == 1 and cache.get_seq_length() == 60


def test_save_load_round_trip(tmp_path):
    student = linearize(
        tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(window=5, sink_tokens=3, learn_mix=True)
    )
    _perturb_mix(student, seed=3)
    student.save_pretrained(tmp_path / "s")
    loaded = load_student(tmp_path / "s")
    assert SlidingWindow.from_dict(loaded.config.window_options) == SlidingWindow(window=5, sink_tokens=3)
    twins = loaded.linear_modules()
    assert all(isinstance(t, SlidingWindowLinearAttention) and t.window == 5 for t in twins.values())
    for i, twin in student.linear_modules().items():
        torch.testing.assert_close(twins[i].log_mix, twin.log_mix)
    ids = torch.randint(3, 97, (1, 17))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, student(ids).logits)


def test_window_options_without_window_are_refused():
    with pytest.raises(ValueError, match="need a sliding window"):
        linearize(tiny_model("llama"), LearnedPRF, 8, sliding_window=SlidingWindow(sink_tokens=2))


def test_far_term_weights_stay_float32_master_weights(bf16_default_dtype):
    """Built under a bf16 default dtype and converted to bf16 (what ``bf16-true`` does), the layer's feature
    map and its far-term weights stay float32."""
    layer = SlidingWindowLinearAttention(LearnedPRF(8, 2, 4), 4, 2, sliding_window=SlidingWindow(window=3)).to(
        torch.bfloat16
    )
    assert {p.dtype for p in layer.parameters()} == {torch.float32}
