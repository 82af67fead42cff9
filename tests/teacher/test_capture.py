"""Capture leaves the teacher's logits unchanged and reports the tensors softmax attention sees; the
reservoir keeps a uniform, bounded sample."""

from __future__ import annotations

import math

import pytest
import torch

from lit_dof.teacher.capture import QKReservoir, capture_attention, capture_batch, pooled_vectors
from tests.conftest import TINYSTORIES, padded_batch, tiny_model


@pytest.mark.parametrize("side", ["left", "right", None])
def test_capture_leaves_logits_identical(family, side):
    model = tiny_model(family)
    if side is None:
        inputs = {"input_ids": torch.randint(3, 97, (2, 13), generator=torch.Generator().manual_seed(0))}
    else:
        ids, mask = padded_batch(side=side)
        inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        plain = model(**inputs).logits
    logits, captured = capture_batch(model, inputs, values=True, outputs=True)
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)
    assert sorted(captured) == list(range(model.config.num_hidden_layers))
    assert model.config._attn_implementation == "sdpa"  # restored
    assert not any(hasattr(m, "lit_dof") for m in model.modules())  # nothing left attached


def test_captured_tensors_reproduce_softmax_attention(family):
    """out == softmax(q kᵀ/√d) v on the captured (scaled) q, k, v: the capture convention is the kernel's."""
    model = tiny_model(family)
    ids, mask = padded_batch(side="right")
    _, captured = capture_batch(model, {"input_ids": ids, "attention_mask": mask}, values=True, outputs=True)
    for index, c in captured.items():
        if getattr(model.config, "layer_types", None) and model.config.layer_types[index] == "sliding_attention":
            continue  # windowed: a different mask
        G = c.q.shape[1] // c.k.shape[1]
        k, v = c.k.double().repeat_interleave(G, 1), c.v.double().repeat_interleave(G, 1)
        T = c.q.shape[2]
        logits = c.q.double() @ k.transpose(-1, -2) / math.sqrt(c.q.shape[-1])
        allowed = torch.ones(T, T, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
        expected = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v
        valid = mask.bool()
        torch.testing.assert_close(c.out.double()[valid], expected.transpose(1, 2)[valid], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(c.key_padding, mask.bool())


def test_capture_real_tinystories_logits_identical():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(TINYSTORIES, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(TINYSTORIES)
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    inputs = tok(["Once upon a time there was a little dog", "The sun"], return_tensors="pt", padding=True)
    with torch.no_grad():
        plain = model(**inputs).logits
    logits, captured = capture_batch(model, dict(inputs))
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)
    assert captured[0].q.shape[:2] == (2, 8) and captured[0].k.shape[1] == 4  # GQA 8 → 4


def test_recorder_sees_every_layer_once_per_forward():
    model = tiny_model("llama")
    seen = []
    with capture_attention(model, lambda i, c: seen.append(i)):
        model(torch.randint(3, 97, (1, 5)))
    assert seen == [0, 1, 2]


def test_pooled_vectors_exclude_padding_and_group_queries():
    B, Hq, Hk, T, d = 2, 4, 2, 5, 3
    q = torch.arange(B * Hq * T * d, dtype=torch.float32).view(B, Hq, T, d)
    k = -torch.arange(1, 1 + B * Hk * T * d, dtype=torch.float32).view(B, Hk, T, d)
    pad = torch.tensor([[True] * 5, [False, False, True, True, True]])
    pools = pooled_vectors(q, k, pad, "kv_head")
    assert pools.shape == (Hk, (2 + 1) * 8, d)  # G=2 query heads + keys, 8 valid tokens
    per_query = pooled_vectors(q, k, pad, "query_head")
    assert per_query.shape == (Hq, 16, d)
    # KV head 1 pools query heads 2, 3 and key head 1 at valid positions only
    expected = torch.cat([q[0, 2], q[1, 2, 2:], q[0, 3], q[1, 3, 2:], k[0, 1], k[1, 1, 2:]])
    assert sorted(map(tuple, pools[1].tolist())) == sorted(map(tuple, expected.tolist()))


def test_reservoir_is_uniform_and_bounded():
    """Inclusion frequency of every item ≈ J/n whatever the batch boundaries (binomial 5σ band)."""
    n, J, trials = 60, 12, 800
    counts = torch.zeros(n)
    for seed in range(trials):
        r = QKReservoir(J, seed=seed)
        items = torch.arange(n, dtype=torch.float32).view(1, n, 1)
        for start, stop in ((0, 7), (7, 31), (31, 60)):
            r.add(0, items[:, start:stop])
            assert r.vectors[0].shape[1] == min(J, stop)  # bounded memory
        sample = r.samples(0)
        assert sample.shape == (1, J, 1) and sample.unique().numel() == J
        counts[sample.long().flatten()] += 1
    p = J / n
    sigma = math.sqrt(trials * p * (1 - p))
    assert (counts - trials * p).abs().max() < 5 * sigma
    assert r.seen[0] == n


def test_reservoir_reports_too_few_vectors():
    r = QKReservoir(10)
    r.add(0, torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="only 4 query/key vectors.*num_samples=10"):
        r.samples(0)
    with pytest.raises(ValueError, match="num_samples"):
        QKReservoir(1)


def test_keyed_reservoirs_merge_into_the_single_process_sample():
    """Batches split between two 'ranks' (and offered in another order), keyed by their global index: the
    merged reservoir holds exactly the vectors, priorities and counts of one reservoir fed every batch."""
    from lit_dof.teacher.capture import QKReservoir

    g = torch.Generator().manual_seed(0)
    batches = {key: torch.randn(3, 20 + key, 4, generator=g) for key in range(7)}
    alone = QKReservoir(16, seed=5)
    for key in range(7):
        for layer in (0, 1):
            alone.add(layer, batches[key] + layer, key=key)
    ranks = [QKReservoir(16, seed=5), QKReservoir(16, seed=5)]
    for key in reversed(range(7)):
        for layer in (0, 1):
            ranks[key % 2].add(layer, batches[key] + layer, key=key)
    merged = ranks[0].merge(ranks[1])
    for layer in (0, 1):
        assert torch.equal(merged.priorities[layer], alone.priorities[layer])
        assert torch.equal(merged.samples(layer), alone.samples(layer))
        assert merged.seen[layer] == alone.seen[layer] == sum(b.shape[1] for b in batches.values())
    with pytest.raises(ValueError, match="J=8"):
        merged.merge(QKReservoir(8))


def test_far_pair_pools_keep_only_vectors_of_pairs_beyond_the_window():
    from lit_dof.teacher.capture import pooled_vectors

    B, Hq, Hk, T, d = 2, 4, 2, 10, 3
    q = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(B, Hq, T, d)  # vector value = position
    k = 100 + torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(B, Hk, T, d)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, :2] = False
    for pooling in ("query_head", "kv_head"):
        pool = pooled_vectors(q, k, pad, pooling, far_window=4, sink_tokens=1)[0, :, 0]
        queries = sorted(int(x) for x in pool if x < 100)
        keys = sorted(int(x) - 100 for x in pool if x >= 100)
        group = 2 if pooling == "kv_head" else 1
        assert queries == sorted([t for t in range(5, 10)] * 2 * group)  # positions ≥ w + s, both rows valid
        assert keys == sorted(list(range(1, 6)) + list(range(2, 6)))  # s … T − 1 − w, row 1's padding excluded
