"""Sliding-window perplexity against a per-token reference (each token scored once, with its window's context)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from lit_dof.evaluation.perplexity import sliding_window_perplexity, windows


@pytest.mark.parametrize("n, window, stride", [(50, 16, 16), (50, 16, 5), (17, 16, 4), (10, 16, 8), (64, 8, 1)])
def test_windows_score_every_token_once_with_enough_context(n, window, stride):
    scored = []
    for start, end, first in windows(n, window, stride):
        assert 0 <= start < first <= end <= n and end - start <= window
        assert first - start >= min(first, max(1, window - stride))  # context: ≥ window − stride (≥ 1) tokens
        scored += range(first, end)
    assert scored == list(range(1, n))


def test_windows_reject_bad_arguments():
    with pytest.raises(ValueError, match="stride"):
        list(windows(10, 8, 9))
    with pytest.raises(ValueError, match="window"):
        list(windows(10, 1, 1))


def test_perplexity_matches_per_token_reference():
    """Each scored token's NLL recomputed alone with exactly the context its window gives it."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    tokens = torch.randint(0, model.config.vocab_size, (45,))
    window, stride = 12, 5
    nll = 0.0
    for start, end, first in windows(tokens.numel(), window, stride):
        for t in range(first, end):
            with torch.no_grad():
                logits = model(tokens[start:t][None]).logits[0, -1].float()
            nll -= float(logits.log_softmax(-1)[tokens[t]])
    expected = math.exp(nll / (tokens.numel() - 1))
    ppl, count = sliding_window_perplexity(model, tokens, window=window, stride=stride, batch_size=3)
    assert count == 44 and ppl == pytest.approx(expected, rel=1e-4)
    disjoint, _ = sliding_window_perplexity(model, tokens, window=window, batch_size=2)
    assert disjoint != pytest.approx(ppl, rel=1e-6)  # less context, a different number


def test_position_perplexity_matches_per_token_reference():
    """Every bucket's perplexity recomputed token by token: each predicted position scored with exactly its
    block's preceding tokens as context."""
    from transformers import AutoModelForCausalLM

    from lit_dof.evaluation.position_perplexity import position_perplexity
    from tests.conftest import tiny_config

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    tokens = torch.randint(0, model.config.vocab_size, (3 * 10 + 4,))  # 3 blocks of 10 and a dropped remainder
    result = position_perplexity(model, tokens, block=10, edges=(0, 3, 7, 10), batch_size=2)
    nll = {(0, 3): [], (3, 7): [], (7, 10): []}
    by_block = [[] for _ in range(3)]
    with torch.no_grad():
        for b in range(3):
            ids = tokens[b * 10 : (b + 1) * 10]
            for t in range(1, 10):
                logp = model(ids[None, :t]).logits[0, -1].log_softmax(-1)[ids[t]]
                nll[next(k for k in nll if k[0] <= t < k[1])].append(-float(logp))
                by_block[b].append(-float(logp))
    for (a, b), values in nll.items():
        bucket = result["buckets"][f"{a}-{b - 1}"]
        assert bucket["tokens"] == len(values)
        assert bucket["ppl"] == pytest.approx(math.exp(sum(values) / len(values)), rel=1e-5)
        width = b - max(a, 1)  # this bucket's predictions per block, block after block
        assert bucket["block_nll"] == pytest.approx(
            [sum(values[i * width : (i + 1) * width]) / width for i in range(3)], rel=1e-5
        )
    assert result["block_nll"] == pytest.approx([sum(v) / 9 for v in by_block], rel=1e-5)
    everything = [x for v in nll.values() for x in v]
    assert result["tokens"] == 27 and result["ppl"] == pytest.approx(math.exp(sum(everything) / 27), rel=1e-5)
    with pytest.raises(ValueError, match="edges"):
        position_perplexity(model, tokens, block=10, edges=(0, 5, 11))
    with pytest.raises(ValueError, match="at least block"):
        position_perplexity(model, tokens[:5], block=10, edges=(0, 10))


def test_paired_perplexity_ratio_is_the_ratio_with_the_blocks_standard_error():
    """exp(mean NLL difference over blocks) is the ratio of the two perplexities (equal tokens per block); its
    log's standard error is the differences' sample SD / √blocks."""
    from lit_dof.evaluation.position_perplexity import paired_perplexity_ratio

    def result(nll, bucket):
        return {"block": 8, "ppl": math.exp(sum(nll) / len(nll)), "block_nll": nll,
                "buckets": {"4-7": {"block_nll": bucket}}}  # fmt: skip  # compact dict

    a, b = result([2.0, 3.0, 2.5, 4.0], [1.0, 1.0, 1.0, 1.0]), result([1.5, 2.0, 2.5, 2.0], [0.5, 1.5, 0.5, 1.5])
    paired = paired_perplexity_ratio(a, b)
    diffs = [0.5, 1.0, 0.0, 2.0]
    assert paired["ratio"] == pytest.approx(a["ppl"] / b["ppl"]) and paired["blocks"] == 4
    assert paired["stderr_log"] == pytest.approx(statistics.stdev(diffs) / 2)
    bucket = paired_perplexity_ratio(a, b, bucket="4-7")
    assert bucket["log_ratio"] == pytest.approx(0.0)
    assert bucket["stderr_log"] == pytest.approx(statistics.stdev([0.5, -0.5] * 2) / 2)
    with pytest.raises(ValueError, match="same"):
        paired_perplexity_ratio(a, {**b, "block_nll": b["block_nll"][:3]})
    with pytest.raises(ValueError, match="block_nll"):
        paired_perplexity_ratio(a, {"block": 8, "ppl": 3.0})
