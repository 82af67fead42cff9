"""Long-document perplexity by in-document position (lit_dof.evaluation.long_documents): every bucket against a
float64 computation by hand on a tiny model, the standard error over documents and the paired ratio against their
closed forms; the script, the compare stage and the test split as the default, on the real corpus."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from lit_dof.evaluation.long_documents import long_document_perplexity
from lit_dof.evaluation.position_perplexity import bucket_ratios, paired_perplexity_ratio
from lit_dof.evaluation.stats import paired_difference, weighted_mean
from tests.conftest import REPO, TINYSTORIES, WIKIPEDIA, load_script, tiny_model

EDGES, LIMIT = (0, 3, 8, 16), 12  # buckets 0-2, 3-7, 8-11 once truncated to 12 tokens
LENGTHS = (5, 10, 20, 2, 9)


class _Words:
    """Token ids written out as words."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False, verbose=True):
        return {"input_ids": [int(w) for w in text.split()]}


class _Documents:
    """A source yielding these texts for any split (the split rules are tests/data/test_splits.py's)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def select(self, split, val_every, *, rank, world, role, workers):
        return iter(self.texts)


def _texts(lengths=LENGTHS) -> list[str]:
    g = torch.Generator().manual_seed(0)
    return [" ".join(str(int(t)) for t in torch.randint(3, 97, (n,), generator=g)) for n in lengths]


def _by_hand(model, texts: list[str]) -> list[list[list[float]]]:
    """Per document and bucket ``[total NLL, tokens]`` in float64, each position scored by a forward of exactly
    the document's tokens before it."""
    model = copy.deepcopy(model).double()
    edges = [0, 3, 8, LIMIT]
    out = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([int(w) for w in text.split()][:LIMIT])
            buckets = [[0.0, 0] for _ in edges[1:]]
            for t in range(1, ids.numel()):
                logp = model(ids[None, :t]).logits[0, -1].log_softmax(-1)[ids[t]]
                k = next(k for k, (a, b) in enumerate(zip(edges, edges[1:])) if a <= t < b)
                buckets[k][0] -= float(logp)
                buckets[k][1] += 1
            out.append(buckets)
    return out


def _closed_form_se(totals: list[float], tokens: list[int]) -> float:
    """The ratio estimator's standard error over documents: √(n/(n−1) Σ (yᵢ − R xᵢ)²) / Σ xᵢ, R = Σ y / Σ x."""
    kept = [(y, x) for y, x in zip(totals, tokens) if x]
    n, ratio = len(kept), sum(y for y, _ in kept) / sum(x for _, x in kept)
    return math.sqrt(n / (n - 1) * sum((y - ratio * x) ** 2 for y, x in kept)) / sum(x for _, x in kept)


def test_buckets_and_their_standard_error_equal_a_float64_computation_by_hand():
    model, texts = tiny_model("llama"), _texts()
    record = long_document_perplexity(model, _Words(), _Documents(texts), max_tokens=LIMIT, edges=EDGES, progress=False,
                                      command=["python", "probe"])  # fmt: skip  # packed args
    hand = _by_hand(model, texts)
    assert list(record["buckets"]) == ["0-2", "3-7", "8-11"] and record["block"] == LIMIT == record["max_tokens"]
    assert record["documents"] == 5 and record["document_tokens"] == list(LENGTHS)
    assert record["provenance"]["command"] == "python probe" and record["provenance"]["versions"]["torch"]
    for k, name in enumerate(record["buckets"]):
        bucket, totals, tokens = record["buckets"][name], [d[k][0] for d in hand], [d[k][1] for d in hand]
        assert bucket["block_tokens"] == tokens and bucket["tokens"] == sum(tokens)
        assert bucket["documents"] == sum(x > 0 for x in tokens)
        assert bucket["ppl"] == pytest.approx(math.exp(sum(totals) / sum(tokens)), rel=1e-5)
        assert bucket["stderr_log"] == pytest.approx(_closed_form_se(totals, tokens), rel=1e-4)
        for nll, y, x in zip(bucket["block_nll"], totals, tokens):
            assert nll is None if x == 0 else nll == pytest.approx(y / x, rel=1e-5)
    assert record["buckets"]["3-7"]["block_tokens"][3] == 0  # the 2-token document ends before position 3
    all_totals = [sum(b[0] for b in d) for d in hand]
    assert record["block_tokens"] == [min(n, LIMIT) - 1 for n in LENGTHS]
    assert record["ppl"] == pytest.approx(math.exp(sum(all_totals) / sum(record["block_tokens"])), rel=1e-5)
    assert record["stderr_log"] == pytest.approx(_closed_form_se(all_totals, record["block_tokens"]), rel=1e-4)


def test_paired_ratios_over_documents_are_the_perplexity_ratios_with_the_closed_form_error():
    texts = _texts()
    a, b = (long_document_perplexity(tiny_model("llama", seed), _Words(), _Documents(texts), max_tokens=LIMIT,
                                     edges=EDGES, progress=False) for seed in (0, 1))  # fmt: skip  # packed args
    ratios = bucket_ratios(a, b)
    assert set(ratios) == {"all", "0-2", "3-7", "8-11"}
    for name in ratios:
        ra, rb = (r if name == "all" else r["buckets"][name] for r in (a, b))
        assert ratios[name]["ratio"] == pytest.approx(ra["ppl"] / rb["ppl"], rel=1e-9)
        tokens = ra["block_tokens"]
        diffs = [(x - y) * w if w else 0.0 for x, y, w in zip(ra["block_nll"], rb["block_nll"], tokens)]
        assert ratios[name]["stderr_log"] == pytest.approx(_closed_form_se(diffs, tokens), rel=1e-9)
        assert ratios[name]["blocks"] == sum(w > 0 for w in tokens)
    fewer = long_document_perplexity(tiny_model("llama"), _Words(), _Documents(texts[:4]), max_tokens=LIMIT,
                                     edges=EDGES, progress=False)  # fmt: skip  # packed args
    with pytest.raises(ValueError, match="the results must score the same"):
        paired_perplexity_ratio(fewer, b)
    other = copy.deepcopy(b)
    other["block_tokens"][0] += 1
    with pytest.raises(ValueError, match="different tokens per document"):
        paired_perplexity_ratio(a, other)


def test_equal_weights_give_the_plain_paired_standard_error():
    a, b = [1.0, 2.5, 0.5, 4.0], [0.5, 2.0, 1.5, 3.0]
    mean, se, n = weighted_mean([x - y for x, y in zip(a, b)], [7, 7, 7, 7])
    assert (mean, n) == (pytest.approx(paired_difference(a, b)[0]), 4)
    assert se == pytest.approx(paired_difference(a, b)[1], rel=1e-12)
    with pytest.raises(ValueError, match="≥ 2 examples with weight > 0"):
        weighted_mean([1.0, None], [3, 0])


def test_the_script_and_the_compare_stage_measure_the_long_documents_of_the_real_corpus(tmp_path):
    """TinyStories (512 positions) on the first 3 long documents: buckets 0–63 and 64–511 of every document; the
    compare stage writes the same record; against itself the ratio is 1 ± 0; the sliding measure scores the test
    split unless told otherwise, and a test record is not paired with a validation one."""
    from transformers import AutoTokenizer

    from lit_dof.comparison.cells import Comparison
    from lit_dof.comparison.rows import ROWS
    from lit_dof.data.sources import split_documents

    script = load_script("heldout_ppl")
    ours = tmp_path / "long_documents.json"
    args = ["--corpus", str(WIKIPEDIA), "--long_documents", "--max_documents", "3"]
    record = script.main([str(TINYSTORIES), *args, "--output", str(ours)])["record"]
    tokenizer = AutoTokenizer.from_pretrained(TINYSTORIES)
    texts = [next(t for i, t in enumerate(split_documents(WIKIPEDIA, "long")) if i == k) for k in range(3)]
    assert record["document_tokens"] == [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert record["documents"] == 3 and record["block"] == 512 and record["split"] == "long"
    assert {name: b["tokens"] for name, b in record["buckets"].items()} == {"0-63": 3 * 63, "64-511": 3 * 448}
    assert "--long_documents --max_documents 3" in record["provenance"]["command"]
    assert "20000 characters" in record["split_rule"]
    again = script.main([str(ours), "--against", str(ours)])["ratios"][str(ours)]
    assert again["64-511"]["ratio"] == 1.0 and again["64-511"]["stderr"] == 0.0

    runner = Comparison(out=tmp_path / "cells", teacher=str(TINYSTORIES), corpus=str(WIKIPEDIA), long_documents=3,
                        device="cpu")  # fmt: skip  # packed args
    cell = runner.long_document_perplexity(ROWS["teacher"], 16)
    assert json.loads((tmp_path / "cells" / "C16" / "teacher" / "long_documents.json").read_text()) == cell
    assert cell["buckets"]["64-511"]["block_nll"] == pytest.approx(record["buckets"]["64-511"]["block_nll"], rel=1e-6)
    assert str(REPO.parent) not in cell["source"]  # recorded without this machine's paths

    for split in ("test", "validation"):
        args = ["--corpus", str(WIKIPEDIA), "--tokens", "600", "--output", str(tmp_path / f"{split}.json")]
        found = script.main([str(TINYSTORIES), *args] + (["--split", split] if split == "validation" else []))
        assert found["record"]["split"] == split and found["record"]["tokens"] == 599
    with pytest.raises(SystemExit, match="measured different splits \\(test and validation\\)"):
        script.main([str(tmp_path / "test.json"), "--against", str(tmp_path / "validation.json")])


def test_paired_seed_difference_is_the_paired_t_over_runs():
    """Recipes compared over seeds: the mean paired difference, sd/√n, the t interval (df = n − 1); with ``log``
    the geometric-mean ratio; seeds only one recipe has are left out; one seed in common is refused."""
    from lit_dof.evaluation.stats import paired_seed_difference

    a, b = {0: 30.0, 1: 32.0, 2: 31.0, 7: 99.0}, {0: 31.0, 1: 34.0, 2: 31.0}
    result = paired_seed_difference(a, b)
    diffs = [-1.0, -2.0, 0.0]
    sd = math.sqrt(sum((d + 1) ** 2 for d in diffs) / 2)
    assert result["seeds"] == [0, 1, 2] and result["n"] == 3
    assert result["difference"] == pytest.approx(-1.0) and result["stderr"] == pytest.approx(sd / math.sqrt(3))
    assert result["ci95"] == pytest.approx((-1.0 - 4.303 * sd / math.sqrt(3), -1.0 + 4.303 * sd / math.sqrt(3)))
    ratio = paired_seed_difference(a, b, log=True)
    assert ratio["ratio"] == pytest.approx((30 / 31 * 32 / 34 * 31 / 31) ** (1 / 3))
    with pytest.raises(ValueError, match="needs >= 2 seeds in common"):
        paired_seed_difference({0: 1.0}, {0: 2.0, 1: 3.0})


@pytest.mark.parametrize("length", [2, 7, 8, 9])
def test_next_token_nll_in_chunks_is_the_float64_log_softmax(length):
    """Chunks of 3 positions (a document of 2 tokens, one shorter than a chunk, one a multiple of it plus one, …)
    against −log softmax in float64 gathered at the next token."""
    from lit_dof.evaluation.position_perplexity import next_token_nll

    g = torch.Generator().manual_seed(length)
    logits, ids = torch.randn(2, length, 11, generator=g), torch.randint(0, 11, (2, length), generator=g)
    reference = -torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    nll = next_token_nll(logits, ids, chunk=3)
    assert nll.shape == (2, length - 1)
    torch.testing.assert_close(nll.double(), reference, rtol=1e-6, atol=1e-6)
