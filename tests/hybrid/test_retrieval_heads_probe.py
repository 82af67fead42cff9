"""tools/retrieval_heads_probe.py: the per-head masks are causal in the exact KV heads and window + sinks elsewhere (a
closed-form mask); the masked teacher is the plain teacher with every head exact and lit-dof's window control
(its own kernel) with none; head scores (lit_dof.pipeline.exact_heads, tested there) are attention masses; the probe
runs end to end and records every arm."""

from __future__ import annotations

import copy
import json
import shlex

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.students import linearize
from lit_dof.teacher.loading import load_teacher
from tests.conftest import TINYSTORIES, WIKIPEDIA, load_script
from tests.hybrid.test_cli import needs_data

tool = load_script("retrieval_heads_probe", "tools")


def test_mask_is_causal_in_exact_heads_and_window_plus_sinks_elsewhere():
    mask = tool.HeadWindows(window=2, sinks=1, exact={0: frozenset({1})}).mask(0, 4, 2, 5, "cpu")[0]
    causal = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    local = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.bool
    )  # the query's own token, the one before it, and the sink (token 0)
    assert torch.equal(mask[0], local) and torch.equal(mask[1], local)  # query heads 0, 1 read KV head 0
    assert torch.equal(mask[2], causal) and torch.equal(mask[3], causal)  # query heads 2, 3 read KV head 1 (exact)
    assert torch.equal(tool.HeadWindows(2, 1).mask(1, 4, 2, 5, "cpu")[0, 3], local)  # another layer: none exact


@torch.no_grad()
def test_masked_teacher_is_the_full_teacher_or_the_window_control():
    teacher = load_teacher(str(TINYSTORIES))[0]
    ids = torch.randint(3, 2000, (1, 40), generator=torch.Generator().manual_seed(0))
    full = teacher(ids, use_cache=False).logits
    control = linearize(copy.deepcopy(teacher), LearnedPRF, 4, sliding_window=SlidingWindow(6, 2, far_term=False))
    windowed = control.eval()(ids, use_cache=False).logits
    every = {layer: frozenset(range(4)) for layer in range(2)}
    tool.set_head_windows(teacher, tool.HeadWindows(6, 2, every))
    torch.testing.assert_close(teacher(ids, use_cache=False).logits, full, rtol=1e-4, atol=1e-4)
    tool.set_head_windows(teacher, tool.HeadWindows(6, 2))
    torch.testing.assert_close(teacher(ids, use_cache=False).logits, windowed, rtol=1e-4, atol=1e-4)
    tool.set_head_windows(teacher, tool.HeadWindows(6, 2, {1: frozenset({0, 3})}))  # between the two
    mixed = teacher(ids, use_cache=False).logits
    assert not torch.allclose(mixed, full, atol=1e-3) and not torch.allclose(mixed, windowed, atol=1e-3)
    assert torch.allclose(mixed[0, :8], full[0, :8], atol=1e-4)  # window + sinks cover the first 8 tokens
    cache = teacher(ids).past_key_values  # a prefill with a cache is fine
    with pytest.raises(ValueError, match="no decoding from a cache"):
        teacher(ids[:, :1], cache=cache)
    tool.set_head_windows(teacher, None)
    torch.testing.assert_close(teacher(ids).logits, full)


@needs_data
def test_scores_are_attention_masses_and_the_probe_records_every_arm(tmp_path):
    from lit_dof.hybrid.recall_items import recall_blocks

    teacher, tokenizer = load_teacher(str(TINYSTORIES))
    items = recall_blocks(WIKIPEDIA, tokenizer, 96, 3, 0)[0]
    scores = tool.head_scores(teacher, items)
    assert scores.shape == (2, 4) and bool((scores >= 0).all()) and bool((scores <= 1 + 1e-6).all())
    each = torch.stack([tool.head_scores(teacher, [item]) for item in items])
    torch.testing.assert_close(scores, each.mean(0))  # the mean over items of each item's mass
    passkeys = tool.passkey_items(tokenizer, 256, [0.5], 2)
    for item in passkeys:
        start, stop = item["answer"]
        assert (
            stop == item["input_ids"].shape[1] and tokenizer.decode(item["input_ids"][0, start:stop]).strip().isdigit()
        )
    out = tmp_path / "probe.json"
    common = f"--teacher {TINYSTORIES} --corpus {WIKIPEDIA} --score_block 96 --skip 0 --contexts 256 --depths 0.5"
    tool.main(
        shlex.split(f"{common} --layers 1 --heads 2 4 --window 8 --sinks 2 --score_items 2 --trials 1 --json {out}")
    )
    record = json.loads(out.read_text())
    assert set(record["arms"]) == {"full", "window", "layers", "heads2", "heads4"}
    assert record["arms"]["layers"] == {"1": [0, 1, 2, 3]} and sum(map(len, record["arms"]["heads4"].values())) == 4
    assert all(
        set(r) == {"recall@256", "passkey@256"} and all(len(v) == 1 for v in r.values())
        for r in record["results"].values()
    )
    tool.main(shlex.split(f"{common} --layers 1 --heads 4 --arms layers heads --score_items 1 --trials 1 --json {out}"))
    assert set(json.loads(out.read_text())["arms"]) == {"layers", "heads4"}
