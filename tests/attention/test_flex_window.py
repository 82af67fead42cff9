"""The window + sinks softmax through ``flex_attention`` (``window_kernel="flex"``) against the quadratic float64
reference: its normalised output and log-normaliser alone, and the whole sliding-window + linear attention
(far term with decay and mixing weight, GQA, left padding), uncompiled on the CPU, forward only (flex_attention
has no CPU backward); the compiled kernel and the gradients run in tests/attention/test_cuda.py."""

import warnings

import pytest
import torch

from lit_dof.attention import SlidingWindow, SlidingWindowLinearAttention
from lit_dof.attention.feature_maps import LearnedPRF
from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention
from lit_dof.attention.ops.sliding_window.flex import _shared_block_mask, flex_window_softmax, window_block_mask
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention, sliding_window_masks

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
CASES = {"T37-w5-s3": (37, 5, 3), "T70-w16-s0": (70, 16, 0), "T20-w100-s2": (20, 100, 2), "T150-w1-s1": (150, 1, 1)}


def _inputs(B, Hq, Hk, T, d=8, M=6, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, Hq, T, d), (B, Hk, T, d), (B, Hk, T, D), (B, Hq, T, M), (B, Hk, T, M)]
    x = [torch.randn(*s, generator=g, dtype=torch.float64) * (1.5 if i > 2 else 1.0) for i, s in enumerate(shapes)]
    return x + [torch.randn(Hq, generator=g, dtype=torch.float64), torch.rand(Hk, generator=g, dtype=torch.float64)]


@pytest.mark.parametrize("case", list(CASES))
def test_output_and_log_normaliser_match_float64_softmax(case):
    T, window, sinks = CASES[case]
    q, k, v = _inputs(2, 4, 2, T)[:3]
    o, log_z = flex_window_softmax(q, k, v, window=window, sink_tokens=sinks)
    exact, _ = sliding_window_masks(T, window, sinks)
    logits = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 8**0.5).masked_fill(~exact, float("-inf"))
    torch.testing.assert_close(log_z, logits.logsumexp(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o, logits.softmax(-1) @ v.repeat_interleave(2, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "left-padded"])
def test_the_whole_layer_with_flex_matches_the_reference_and_the_torch_window(case, padded):
    T, window, sinks = CASES[case]
    q, k, v, lq, lk, mix, decay = _inputs(2, 4, 2, T, seed=1)
    mask = torch.ones(2, T, dtype=torch.bool)
    if padded:
        mask[1, : T // 3] = False  # row 1 starts with padding: its sinks are padding
    kw = {"window": window, "sink_tokens": sinks, "key_padding_mask": mask, "log_mix": mix, "far_decay": decay}
    keep = mask[:, None, :, None]  # padding queries' rows are meaningless
    ref = naive_sliding_window_attention(q, k, v, lq, lk, **kw).masked_fill(~keep, 0)
    for kernel in ("flex", "torch"):
        out, state = sliding_window_linear_attention(q, k, v, lq, lk, chunk_size=16, window_kernel=kernel, **kw)
        torch.testing.assert_close(out.masked_fill(~keep, 0), ref, rtol=1e-5, atol=1e-6)  # far part: float32
        assert state.seen == T


def test_flex_refuses_a_cpu_backward_clearly():
    q, k, v = (x.requires_grad_() for x in _inputs(1, 2, 2, 12)[:3])
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_window_softmax(q, k, v, window=4)


def test_one_block_mask_serves_every_call_without_padding():
    q, k, v = _inputs(2, 4, 2, 37)[:3]
    fresh = flex_window_softmax(q, k, v, window=5, sink_tokens=3, block_mask=window_block_mask(37, 5, 3, "cpu"))
    _shared_block_mask.cache_clear()
    first = flex_window_softmax(q, k, v, window=5, sink_tokens=3)
    again = flex_window_softmax(q, k, v, window=5, sink_tokens=3, key_padding_mask=torch.ones(2, 37, dtype=torch.bool))
    info = _shared_block_mask.cache_info()
    assert (info.misses, info.hits) == (1, 1)  # built once, reused by the unpadded batch given an all-True mask
    for out in (first, again):
        torch.testing.assert_close(out, fresh, rtol=0, atol=0)
    flex_window_softmax(q, k, v, window=6, sink_tokens=3)
    assert _shared_block_mask.cache_info().misses == 2  # other settings, another mask
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, :4] = False
    flex_window_softmax(q, k, v, window=5, sink_tokens=3, key_padding_mask=mask)
    assert _shared_block_mask.cache_info().misses == 2  # a padded batch builds its own, never the shared one


def test_a_row_that_sees_no_key_is_empty_not_nan():
    q, k, v = _inputs(1, 2, 2, 12)[:3]
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, :5] = False  # queries 0-4 see only padding (window 1: only themselves)
    o, log_z = flex_window_softmax(q, k, v, window=1, key_padding_mask=mask)
    assert (o[:, :, :5] == 0).all() and torch.isneginf(log_z[:, :, :5]).all()
    assert torch.isfinite(o).all() and torch.isfinite(log_z[:, :, 5:]).all()


def test_the_layer_switches_kernels_and_keeps_decoding_on_its_own():
    torch.manual_seed(0)
    layer = SlidingWindowLinearAttention(
        LearnedPRF(8, 2, 6), 4, 2, sliding_window=SlidingWindow(window=8, sink_tokens=2, far_decay=16.0)
    ).double()
    q, k, v = _inputs(1, 4, 2, 40)[:3]
    with torch.no_grad():
        ref, ref_state = layer(q, k, v)
        layer.window_kernel = "flex"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, state = layer(q[:, :, :30], k[:, :, :30], v[:, :, :30])  # prefill by flex, then continue
        rest, _ = layer(q[:, :, 30:], k[:, :, 30:], v[:, :, 30:], state)
    torch.testing.assert_close(torch.cat([out, rest], 2), ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="window_kernel must be 'torch' or 'flex', got 'fla'"):
        sliding_window_linear_attention(q, k, v, None, None, window=4, window_kernel="fla")
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, T=40\)"):
        window_block_mask(40, 4, 0, "cpu", torch.ones(1, 39, dtype=torch.bool))


def test_heads_below_the_compiled_kernels_minimum_are_padded(monkeypatch):
    """Inductor's flex_attention kernel takes head sizes ≥ 16 (a GPU run with d = 8 failed to compile): the compiled
    path zero-pads q/k and v to 16 and keeps the scale 1/√d, so output and log-normaliser are those of the unpadded
    heads. The compiled kernel is stood in for by the reference one, with the kernel's shape rule checked."""
    from torch.nn.attention.flex_attention import flex_attention

    import lit_dof.attention.ops.sliding_window.flex as flex_module

    def strict(q, k, v, **kw):
        assert min(q.shape[-1], k.shape[-1], v.shape[-1]) >= flex_module.MIN_COMPILED_HEAD
        return flex_attention(q, k, v, **kw)

    monkeypatch.setattr(flex_module, "_compiled_flex_attention", lambda: strict)
    q, k, v = _inputs(2, 4, 2, 37)[:3]
    got = flex_window_softmax(q, k, v, window=5, sink_tokens=3, compiled=True)
    want = flex_window_softmax(q, k, v, window=5, sink_tokens=3, compiled=False)
    assert got[0].shape == v.repeat_interleave(2, 1).shape
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
