"""The exact far cache's references (issue #45, item 3): which far tokens are kept (the K of highest score among
those that left the window; at most one enters and one leaves per query, as a decoding heap would), their score
(the window's attention mass, against a loop), and the attention with them — no cache is today's reference, a cache
as large as the sequence is full causal softmax attention (the far term has nothing left), in float64."""

from __future__ import annotations

import pytest
import torch

from lit_dof.attention.ops.sliding_window.far_cache import (
    banded_window_mass,
    cached_far_pairs,
    key_novelty,
    running_top_k,
    window_mass_scores,
)
from lit_dof.attention.ops.sliding_window.far_cache_state import apply_far_cache
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention, sliding_window_masks


def _inputs(B=2, Hq=4, Hk=2, T=24, d=8, M=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, Hq, T, d, generator=g), torch.randn(B, Hk, T, d, generator=g)
    v = torch.randn(B, Hk, T, 5, generator=g)
    lq, lk = torch.randn(B, Hq, T, M, generator=g), torch.randn(B, Hk, T, M, generator=g)
    return q, k, v, lq, lk


def test_window_mass_is_the_column_sum_of_the_exact_softmax_rows():
    q, k, _, _, _ = _inputs()
    window, sinks = 5, 2
    scores = window_mass_scores(q, k, window=window, sink_tokens=sinks)
    B, Hq, T, d = q.shape
    exact, _ = sliding_window_masks(T, window, sinks)
    expected = torch.zeros(B, 2, T, dtype=torch.float64)
    for h in range(Hq):
        for i in range(T):
            allowed = exact[i].nonzero().flatten()
            logits = torch.einsum("bd,bnd->bn", q[:, h, i].double(), k[:, h // 2, allowed].double()) / d**0.5
            row = torch.softmax(logits, -1)
            for col, j in enumerate(allowed.tolist()):
                if i - window < j <= i:  # inside the window (a sink is no window token)
                    expected[:, h // 2, j] += row[:, col]
    torch.testing.assert_close(scores, expected)


def test_the_cache_keeps_the_top_k_far_tokens_and_changes_by_at_most_one_per_step():
    scores = torch.tensor([[[3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 8.0]]])  # ties: 1, 1 / 5, 5, 5
    window, sinks, size = 3, 1, 3
    kept = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=size)[0, 0]
    _, far = sliding_window_masks(12, window, sinks)
    for i in range(12):
        far_keys = far[i].nonzero().flatten().tolist()
        ranked = sorted(far_keys, key=lambda j: (-scores[0, 0, j].item(), -j))[:size]  # ties to the later key
        assert sorted(kept[i].nonzero().flatten().tolist()) == sorted(ranked), i
        if i + 1 < 12:  # the heap's step: one token left the window, at most one swap
            assert len(set(kept[i + 1].nonzero().flatten().tolist()) - set(kept[i].nonzero().flatten().tolist())) <= 1
    assert not cached_far_pairs(scores, window=window, sink_tokens=sinks, size=0).any()
    with pytest.raises(ValueError, match="K ≥ 0"):
        cached_far_pairs(scores, window=window, sink_tokens=sinks, size=-1)


@pytest.mark.parametrize("window, sinks", [(4, 0), (6, 2)])
def test_no_cache_is_the_reference_and_a_full_cache_is_softmax_attention(window, sinks):
    q, k, v, lq, lk = _inputs()
    decay = torch.tensor([0.05, 0.2])
    base = naive_sliding_window_attention(q, k, v, lq, lk, window=window, sink_tokens=sinks, far_decay=decay)
    scores = window_mass_scores(q, k, window=window, sink_tokens=sinks)
    T = q.shape[2]
    none = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=0)
    same = naive_sliding_window_attention(
        q, k, v, lq, lk, window=window, sink_tokens=sinks, far_decay=decay, far_cached=none
    )
    torch.testing.assert_close(same, base, rtol=0, atol=0)
    every = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=T)
    full = naive_sliding_window_attention(
        q, k, v, lq, lk, window=window, sink_tokens=sinks, far_decay=decay, far_cached=every
    )
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    softmax = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1), attn_mask=causal
    )  # scale 1/√d: the reference's logits
    torch.testing.assert_close(full.double(), softmax)
    some = naive_sliding_window_attention(
        q,
        k,
        v,
        lq,
        lk,
        window=window,
        sink_tokens=sinks,
        far_decay=decay,
        far_cached=cached_far_pairs(scores, window=window, sink_tokens=sinks, size=3),
    )
    assert not torch.allclose(some, base) and not torch.allclose(some.double(), softmax)
    with pytest.raises(ValueError, match="not the delta-rule memory"):
        naive_sliding_window_attention(q, k, v, lq, lk, window=window, far_cached=every, far_write=torch.ones(2, 2, T))


@pytest.mark.parametrize("window, sinks, size, chunk", [(3, 1, 3, 4), (5, 0, 4, 1), (4, 2, 2, 64), (2, 0, 6, 3)])
def test_the_chunked_running_top_k_is_the_quadratic_one(window, sinks, size, chunk):
    g = torch.Generator().manual_seed(size + chunk)
    scores = torch.randint(0, 5, (2, 3, 29), generator=g).double()  # many ties
    quadratic = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=size)
    indices = running_top_k(scores, window=window, sink_tokens=sinks, size=size, chunk_size=chunk)
    assert indices.shape == (2, 3, 29, size)
    valid = indices >= 0
    rebuilt = torch.zeros(*quadratic.shape[:-1], 30, dtype=torch.bool)  # an extra column takes the empty slots
    rebuilt.scatter_(-1, torch.where(valid, indices, 29), True)
    assert torch.equal(rebuilt[..., :29], quadratic)
    ranked = scores.gather(-1, indices.clamp_min(0).flatten(2)).view_as(indices).masked_fill(~valid, float("-inf"))
    assert (ranked[..., :-1] >= ranked[..., 1:]).all()  # highest score first
    assert torch.equal(running_top_k(scores, window=window, sink_tokens=sinks, size=0), indices[..., :0])


@pytest.mark.parametrize("window, sinks, size", [(4, 0, 3), (6, 2, 5), (3, 1, 40)])
def test_the_cache_applied_to_the_attention_without_it_is_the_reference_with_it(window, sinks, size):
    q, k, v, lq, lk = (x.double() for x in _inputs())  # float64 throughout: the reference returns v's dtype
    decay, mix = torch.tensor([0.05, 0.2]), torch.tensor([0.3, -0.1, 0.0, 0.5])
    kwargs = dict(window=window, sink_tokens=sinks, far_decay=decay, log_mix=mix)
    y, log_z = naive_sliding_window_attention(q, k, v, lq, lk, **kwargs, return_log_z=True)
    scores = window_mass_scores(q, k, window=window, sink_tokens=sinks)
    indices = running_top_k(scores, window=window, sink_tokens=sinks, size=size, chunk_size=5)
    got, got_log_z = apply_far_cache(y, log_z, q, k, v, lq, lk, indices, window=window, log_mix=mix, far_decay=decay)
    cached = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=size)
    want, want_log_z = naive_sliding_window_attention(q, k, v, lq, lk, **kwargs, far_cached=cached, return_log_z=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_log_z, want_log_z)


@pytest.mark.parametrize("window, sinks, chunk", [(5, 2, 4), (3, 0, 1), (7, 1, 64)])
def test_the_banded_window_mass_is_the_quadratic_one(window, sinks, chunk):
    q, k, _, _, _ = (x.double() for x in _inputs())
    exact, _ = sliding_window_masks(q.shape[2], window, sinks)
    logits = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    log_z = torch.logsumexp(logits.masked_fill(~exact, float("-inf")), -1)  # the exact part's normaliser
    banded = banded_window_mass(q, k, log_z, window=window, chunk_size=chunk)
    torch.testing.assert_close(banded, window_mass_scores(q, k, window=window, sink_tokens=sinks))


@pytest.mark.parametrize("dtype, window, sinks, size", [(torch.float64, 5, 2, 4), (torch.float32, 4, 0, 3)])
def test_the_chunked_kernel_with_a_far_cache_is_the_reference_with_it(dtype, window, sinks, size):
    from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention

    q, k, v, lq, lk = (x.to(dtype) for x in _inputs(T=37))
    decay, mix = torch.tensor([0.05, 0.2], dtype=dtype), torch.tensor([0.3, -0.1, 0.0, 0.5], dtype=dtype)
    kwargs = dict(window=window, sink_tokens=sinks, far_decay=decay, log_mix=mix)
    y, _ = sliding_window_linear_attention(q, k, v, lq, lk, **kwargs, far_cache=size, chunk_size=8)
    scores = window_mass_scores(q, k, window=window, sink_tokens=sinks)
    cached = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=size)
    want = naive_sliding_window_attention(
        q.double(), k.double(), v.double(), lq.double(), lk.double(), **kwargs, far_cached=cached
    )
    # the chunked far kernel's own tolerance (tests/attention/test_sliding_window.py): it keeps log-feature offsets
    # within 16 nats, exact to ~1e-6 even in float64
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(y.double(), want, **tolerance)
    without, _ = sliding_window_linear_attention(q, k, v, lq, lk, **kwargs, chunk_size=8)
    assert not torch.allclose(y, without)  # the cache changes the attention
    with pytest.raises(ValueError, match="additive fixed-decay far term"):
        sliding_window_linear_attention(q, k, v, lq, lk, **kwargs, far_cache=size, far_log_gates=torch.zeros(2, 2, 37))


@pytest.mark.parametrize("dtype, window, sinks, size", [(torch.float64, 5, 2, 4), (torch.float32, 3, 0, 40)])
def test_without_a_far_term_the_cache_is_window_sinks_and_heavy_hitters(dtype, window, sinks, size):
    """No log-features: the cached far keys join the window's softmax and nothing else is far (H2O's cache with
    StreamingLLM's sinks) — the float64 reference with those pairs exact and no far term; a cache as large as the
    sequence is full causal softmax attention."""
    from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention

    q, k, v, _, _ = (x.to(dtype) for x in _inputs(T=37))
    y, _ = sliding_window_linear_attention(q, k, v, None, None, window=window, sink_tokens=sinks, far_cache=size)
    scores = window_mass_scores(q, k, window=window, sink_tokens=sinks)
    cached = cached_far_pairs(scores, window=window, sink_tokens=sinks, size=size)
    want = naive_sliding_window_attention(
        q.double(), k.double(), v.double(), None, None, window=window, sink_tokens=sinks, far_cached=cached
    )
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(y.double(), want, **tolerance)
    bare, _ = sliding_window_linear_attention(q, k, v, None, None, window=window, sink_tokens=sinks)
    assert (y - bare).abs().max() > 1e-3  # the kept tokens change the attention
    if size >= 37:
        full = naive_sliding_window_attention(q.double(), k.double(), v.double(), None, None, window=37)
        torch.testing.assert_close(y.double(), full, **tolerance)


@pytest.mark.parametrize("window, chunk", [(5, 4), (1, 3), (9, 64)])
def test_key_novelty_is_one_minus_the_best_cosine_before_it_in_its_window(window, chunk):
    """Against a loop over keys; padding keys are never a neighbour; a key repeated within its window scores 0."""
    _, k, _, _, _ = _inputs(T=29)
    k[:, :, 12] = 3.0 * k[:, :, 10]  # the same direction two positions later
    valid = torch.ones(2, 29, dtype=torch.bool)
    valid[1, :4] = False  # left padding in the second row
    got = key_novelty(k, window=window, valid=valid, chunk_size=chunk)
    unit = torch.nn.functional.normalize(k.double(), dim=-1)
    want = torch.ones(2, 2, 29, dtype=torch.float64)
    for b in range(2):
        for j in range(29):
            before = [i for i in range(max(0, j - window + 1), j) if valid[b, i]]
            if before:
                want[b, :, j] = 1 - (unit[b, :, before] @ unit[b, :, j, :, None]).squeeze(-1).amax(-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if window > 2:
        assert got[:, :, 12].abs().max() < 1e-12


def test_a_pooled_score_is_the_highest_of_the_token_and_the_r_after_it():
    from lit_dof.attention.ops.sliding_window.far_cache import cache_scores

    q, k, _, _, _ = _inputs(T=23)
    valid = torch.ones(2, 23, dtype=torch.bool)
    valid[0, :3] = False
    ranked, raw = cache_scores("novelty", q, k, torch.zeros(2, 4, 23), valid, window=6, pool=3, chunk_size=5)
    torch.testing.assert_close(raw, key_novelty(k, window=6, valid=valid).masked_fill(~valid[:, None], -float("inf")))
    for j in range(23):
        want = raw[:, :, j : j + 4].amax(-1).masked_fill(~valid[:, None, j], -float("inf"))
        torch.testing.assert_close(ranked[:, :, j], want)
    for bad in [dict(pool=6), dict(pool=-1)]:
        with pytest.raises(ValueError, match="far_cache_pool"):
            cache_scores("novelty", q, k, torch.zeros(2, 4, 23), valid, window=6, **bad)
    with pytest.raises(ValueError, match="novelty score only"):
        cache_scores("window_mass", q, k, torch.zeros(2, 4, 23), valid, window=6, pool=2)


@pytest.mark.parametrize("far_term", [True, False])
def test_the_kernel_with_a_novelty_cache_is_the_reference_with_those_pairs(far_term):
    from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention

    q, k, v, lq, lk = (x.double() for x in _inputs(T=37))
    lq, lk = (lq, lk) if far_term else (None, None)
    kwargs = dict(window=5, sink_tokens=2, far_decay=torch.tensor([0.05, 0.2]).double() if far_term else None)
    for pool in (0, 2):
        y, _ = sliding_window_linear_attention(
            q, k, v, lq, lk, **kwargs, far_cache=4, far_cache_score="novelty", far_cache_pool=pool, chunk_size=8
        )
        score = key_novelty(k, window=5)
        score = torch.nn.functional.pad(score, (0, pool), value=-float("inf")).unfold(-1, pool + 1, 1).amax(-1)
        cached = cached_far_pairs(score, window=5, sink_tokens=2, size=4)
        want = naive_sliding_window_attention(q, k, v, lq, lk, **kwargs, far_cached=cached)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    mass, _ = sliding_window_linear_attention(q, k, v, lq, lk, **kwargs, far_cache=4, chunk_size=8)
    assert not torch.allclose(y, mass)  # another score, other tokens kept
    with pytest.raises(ValueError, match="far_cache_score"):
        sliding_window_linear_attention(q, k, v, lq, lk, **kwargs, far_cache=4, far_cache_score="surprise")


@pytest.mark.parametrize("score, pool", [("window_mass", 0), ("novelty", 0), ("novelty", 3)])
@pytest.mark.parametrize("far_term", [True, False])
@pytest.mark.parametrize("prefill", [0, 1, 9, 30])
def test_decoding_with_the_cache_continues_the_parallel_form(prefill, far_term, score, pool):
    """A prefill of ``prefill`` tokens, then one token at a time, gives the outputs of one parallel pass over the
    sequence: the K-slot cache admits each token that leaves the window with its final mass, as the running top K
    would keep it (ties included: the scores are continuous here) — with the far term and without one."""
    from lit_dof.attention.ops.sliding_window.chunked import sliding_window_linear_attention

    q, k, v, lq, lk = (x.double() for x in _inputs(T=37))
    features = (lq, lk) if far_term else (None, None)

    def attend(part: slice, state=None):
        lq_part, lk_part = (None if x is None else x[:, :, part] for x in features)
        return sliding_window_linear_attention(
            q[:, :, part], k[:, :, part], v[:, :, part], lq_part, lk_part, state=state, **kwargs
        )

    kwargs = dict(window=5, sink_tokens=2, far_decay=torch.tensor([0.05, 0.2]).double(), far_cache=3, chunk_size=8)
    kwargs |= dict(log_mix=torch.tensor([0.3, -0.1, 0.0, 0.5]).double(), far_cache_score=score, far_cache_pool=pool)
    full, _ = attend(slice(None))
    state, outs = None, []
    if prefill:
        out, state = attend(slice(0, prefill))
        outs.append(out)
    for t in range(prefill, 37):
        out, state = attend(slice(t, t + 1), state)
        outs.append(out)
    # the far sums agree to the kernels' ~1e-6 (test_sliding_window.py); the cache subtracts its keys' estimates from
    # them, which can lift that relative error by a few times where those estimates are most of the far mass
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-4, atol=1e-5)
    assert state.cache.keys.shape == (2, 2, 3, 8) and (state.cache.positions >= 2).all()  # full, no sink cached
    assert state.cache.log_phi.shape[-1] == (6 if far_term else 0)
    with pytest.raises(ValueError, match="one token at a time"):
        attend(slice(0, 2), state)


def test_the_student_option_is_checked_and_the_windowed_softmax_loss_refuses_it():
    from lit_dof.attention import LearnedPRF, SlidingWindow
    from lit_dof.attention.layers.sliding_window import SlidingWindowLinearAttention
    from lit_dof.students.losses import attention_distillation_loss

    assert SlidingWindow(window=4, far_cache=2).far_cache == 2
    assert SlidingWindow(window=4, far_term=False, far_cache=2).far_cache == 2  # heavy hitters, nothing to train
    assert SlidingWindow(window=4, far_cache=2, far_cache_score="novelty").far_cache_score == "novelty"
    with pytest.raises(ValueError, match="far_cache_score must be 'window_mass' or 'novelty'"):
        SlidingWindow(window=4, far_cache=2, far_cache_score="surprise")
    assert SlidingWindow(window=4, far_cache=2, far_cache_score="novelty", far_cache_pool=3).far_cache_pool == 3
    with pytest.raises(ValueError, match="novelty score only"):
        SlidingWindow(window=4, far_cache=2, far_cache_pool=1)
    with pytest.raises(ValueError, match="below the window"):
        SlidingWindow(window=4, far_cache=2, far_cache_score="novelty", far_cache_pool=4)
    for bad, message in [
        (dict(window=4, far_cache=-1), "far_cache must be an integer >= 0"),
        (dict(window=4, far_cache=2, far_gate=True, far_decay=128.0), "additive far term without a gate"),
        (dict(window=4, far_cache=2, far_memory="delta"), "additive far term without a gate"),
        (dict(window=0, far_cache=2), "need a sliding window"),
    ]:
        with pytest.raises(ValueError, match=message):
            SlidingWindow(**bad)
    layer = SlidingWindowLinearAttention(LearnedPRF(8, 2, 6), 4, 2, sliding_window=SlidingWindow(window=4, far_cache=2))
    q, k, v, _, _ = _inputs()
    with pytest.raises(ValueError, match="output loss"):
        attention_distillation_loss(layer, q, k)
