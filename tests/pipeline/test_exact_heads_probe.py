"""The retrieval-head probe (lit_dof.pipeline.exact_heads): its scores against a float64 loop over the attention
weights, the top-k choice against a hand-made score table, the share's count, the layers it may choose from (a
hybrid's softmax layers and Gemma 3's own sliding-window layers excluded), its errors, and a fit whose exact heads
are the probe's own choice on the run's validation documents."""

from __future__ import annotations

import pytest
import torch

from lit_dof.pipeline.exact_heads import RetrievalHeads, head_scores, resolve_exact_heads, top_heads
from lit_dof.teacher.families import attention_layers
from tests.conftest import tiny_model


def _items(vocab: int = 97, length: int = 40, count: int = 3) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    items = []
    for i in range(count):
        ids = torch.randint(3, vocab, (1, length), generator=g)
        items.append({"input_ids": ids, "answer": (length - 3, length), "fact": 5 + i, "fact_end": 11 + i})
    return items


def _reference_scores(model, items) -> torch.Tensor:
    """Loops in float64 over the eager attention weights of a float64 copy: per item, per layer, per query head, the
    mean over answer-predicting rows of the mass on the fact's columns; max per KV group; mean over items."""
    import copy

    model = copy.deepcopy(model).double()
    model.set_attn_implementation("eager")
    layers = attention_layers(model)
    hq, hk = layers[0].num_heads, layers[0].num_kv_heads
    out = torch.zeros(len(layers), hk, dtype=torch.float64)
    for item in items:
        weights = model(item["input_ids"], output_attentions=True, use_cache=False).attentions
        start, stop = item["answer"]
        for index, w in enumerate(weights):
            for kv in range(hk):
                best = 0.0
                for h in range(kv * (hq // hk), (kv + 1) * (hq // hk)):
                    rows = [
                        sum(float(w[0, h, i, j]) for j in range(item["fact"], item["fact_end"]))
                        for i in range(start - 1, stop - 1)
                    ]
                    best = max(best, sum(rows) / len(rows))
                out[index, kv] += best
    return out / len(items)


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_head_scores_match_a_float64_loop_and_restore_the_attention(family):
    model = tiny_model(family)
    items = _items()
    scores = head_scores(model, items)
    assert scores.shape == (len(attention_layers(model)), attention_layers(model)[0].num_kv_heads)
    torch.testing.assert_close(scores, _reference_scores(model, items), rtol=1e-5, atol=1e-6)
    assert model.config._attn_implementation == "sdpa" and 0 < scores.max() <= 1  # restored; masses
    with pytest.raises(ValueError, match="at least one recall item"):
        head_scores(model, [])


def test_top_heads_picks_the_highest_scores_among_the_allowed_layers():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.5], [0.95, 0.0, 0.7]], dtype=torch.float64)
    assert top_heads(scores, 3) == {0: [0], 1: [1], 2: [0]}
    assert top_heads(scores, 4) == {0: [0], 1: [1], 2: [0, 2]}
    assert top_heads(scores, 3, layers=[0, 1]) == {0: [0, 2], 1: [1]}  # 0.5 tie: the lower layer first
    assert top_heads(scores, 0) == {}
    with pytest.raises(ValueError, match="there are 6 to choose from"):
        top_heads(scores, 7, layers=[1, 2])
    with pytest.raises(ValueError, match=r"must lie in 0\.\.2"):
        top_heads(scores, 1, layers=[3])


class _Data:
    """A data module's two members the probe reads."""

    val_every = 2

    def __init__(self, texts):
        self.texts = texts

    @property
    def documents(self):
        from lit_dof.data.sources import LocalDocuments

        return LocalDocuments(lambda: iter(self.texts))


class _Tokenizer:
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + (ord(c) % 90) for c in text]}


@torch.no_grad()
def test_the_probe_counts_its_share_of_the_linearised_heads_and_skips_softmax_and_sliding_layers():
    texts = ["filler text of a validation document " * 12] * 8  # every second one is validation (val_every = 2)
    probe = RetrievalHeads(share=0.5, items=2, block=200, skip=0)
    llama = tiny_model("llama")  # 3 layers x 2 KV heads
    chosen = resolve_exact_heads(probe, llama, _Tokenizer(), _Data(texts), softmax_layers=[1])
    assert sum(map(len, chosen.values())) == 2 and 1 not in chosen  # round(0.5 * 2 * 2 linearised layers)
    gemma = tiny_model("gemma3_text")
    linear = [a.index for a in attention_layers(gemma) if a.linearizable]
    chosen = resolve_exact_heads(probe, gemma, _Tokenizer(), _Data(texts))
    assert chosen and set(chosen) <= set(linear)
    assert (
        resolve_exact_heads(RetrievalHeads(0.0, block=200), llama, _Tokenizer(), _Data(texts)) == {}
    )  # nothing to score
    assert resolve_exact_heads({"2": [1]}, llama, None, None) == {2: [1]}
    with pytest.raises(ValueError, match="KV heads in 0..1"):
        resolve_exact_heads({2: [2]}, llama, None, None)
    with pytest.raises(ValueError, match="has none: pass the heads themselves"):
        resolve_exact_heads(probe, llama, _Tokenizer(), object())
    with pytest.raises(ValueError, match="beyond the teacher's 256 positions"):
        resolve_exact_heads(RetrievalHeads(block=1024), llama, _Tokenizer(), _Data(texts))
    with pytest.raises(ValueError, match="gives only"):
        resolve_exact_heads(RetrievalHeads(items=50, block=200, skip=0), llama, _Tokenizer(), _Data(texts))
    with pytest.raises(ValueError, match=r"share must lie in \[0, 1\]"):
        RetrievalHeads(share=1.5)


def test_a_fit_keeps_exact_the_heads_the_probe_finds_on_its_validation_documents(tmp_path):
    from lit_dof.data.sources import split_documents
    from lit_dof.hybrid.recall_items import document_recall_items
    from lit_dof.students import load_student
    from lit_dof.students.surgery import exact_heads
    from lit_dof.teacher.loading import load_teacher
    from tests.conftest import TINYSTORIES, WIKIPEDIA
    from tests.pipeline.test_cli import _run

    probe = "{class_path: lit_dof.pipeline.exact_heads.RetrievalHeads, init_args: {share: 0.25, items: 2, block: 128}}"
    cli, log_dir = _run(
        tmp_path, "methods/swa_sink_linear.yaml", steps=2, extra=[f"--model.init_args.exact_heads={probe}"]
    )
    teacher, tokenizer = load_teacher(str(TINYSTORIES))
    items = document_recall_items(split_documents(str(WIKIPEDIA), "validation"), tokenizer, 128, 2, skip=32)
    expected = top_heads(head_scores(teacher, items), 2)  # round(0.25 * 4 KV heads * 2 layers)
    student = load_student(log_dir / "student")
    assert exact_heads(student.model) == expected and sum(map(len, expected.values())) == 2
    assert torch.isfinite(cli.trainer.callback_metrics["val/ppl_student"])


PROBE_PEAK = """
import gc, json, sys
from pathlib import Path
import torch
from lit_dof.pipeline.exact_heads import head_scores
from lit_dof.teacher.loading import load_teacher
from tests.pipeline.memory_probe import _status

teacher = load_teacher(sys.argv[1])[0]
T = int(sys.argv[2])
item = {"input_ids": torch.randint(3, 1000, (1, T)), "answer": (T - 3, T), "fact": 10, "fact_end": 20}
head_scores(teacher, [item])  # allocator warm
gc.collect()
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the teacher and imports do not count
baseline = _status("VmRSS")
head_scores(teacher, [item])
print(json.dumps({"baseline": baseline, "peak": _status("VmHWM")}))
"""


@pytest.mark.slow
def test_the_plans_probe_phase_matches_the_measured_peak(smollm2_dir):
    """The plan's ``probe`` phase (every layer's attention weights kept by ``output_attentions``, one layer's scores,
    the logits) against the resident-set peak of one SmolLM2 item of 512 tokens (a subprocess, the teacher
    loaded before the high-water mark is reset): within 25%."""
    import json
    import subprocess
    import sys

    from lit_dof.pipeline.cli import parse_fit_config
    from lit_dof.pipeline.plan_report import plan_config
    from tests.conftest import REPO
    from tests.pipeline.test_plan import _env

    run = subprocess.run(
        [sys.executable, "-c", PROBE_PEAK, str(smollm2_dir), "512"],
        cwd=REPO,
        env=_env(MALLOC_MMAP_THRESHOLD_="65536"),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    probe = json.loads(run.stdout.strip().splitlines()[-1])
    measured = probe["peak"] - probe["baseline"]
    args = ["--config", str(REPO / "configs/quickstart.yaml"), f"--model.init_args.teacher={smollm2_dir}"]
    args.append("--model.init_args.exact_heads.init_args.block=512")
    phase = next(p for p in plan_config(parse_fit_config(args))[2] if p.name == "probe")
    estimated = sum(v for k, v in phase.host.items() if not k.startswith(("runtime", "teacher")))
    assert measured > 0.25 * 2**30  # the attention weights of 30 layers: a real workload
    assert abs(estimated - measured) <= 0.25 * measured, (estimated / 2**30, measured / 2**30)
