"""scripts/heldout_ppl.py: a model's held-out record and its paired ratios to other records, checked against the
ratio computed by hand from the two records' per-block NLL."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.students import linearize
from tests.conftest import TINYSTORIES, load_script


@pytest.fixture
def corpus(tmp_path):
    """Document 0 (the validation one at ``val_every`` 100) long enough for 3 blocks of 512 tokens (the tests
    measure ``--split validation``, as the records measured before the test split)."""
    story = "Once upon a time there was a little dog who liked to run in the park with his friends. "
    path = tmp_path / "corpus.txt"
    path.write_text(story * 120 + "\n\nA second document, for training.\n")
    return path


def test_records_and_paired_ratios_match_the_block_nll_by_hand(tmp_path, corpus):
    script = load_script("heldout_ppl")
    teacher = script.main([str(TINYSTORIES), "--corpus", str(corpus), "--tokens", "1600", "--split", "validation",
                           "--output", str(tmp_path / "teacher.json")])["record"]  # fmt: skip  # packed args
    assert teacher["by_position"]["blocks"] == 3 and (tmp_path / "teacher.json").is_file()

    model = AutoModelForCausalLM.from_pretrained(TINYSTORIES, dtype=torch.float32).eval()
    student = linearize(model, LearnedPRF, 8, sliding_window=SlidingWindow(window=16, sink_tokens=1), seed=0)
    student.save_pretrained(tmp_path / "student")
    AutoTokenizer.from_pretrained(TINYSTORIES).save_pretrained(tmp_path / "student")
    args = ["--corpus", str(corpus), "--tokens", "1600", "--split", "validation",
            "--against", str(tmp_path / "teacher.json")]  # fmt: skip  # compact list
    found = script.main([str(tmp_path / "student"), *args, "--output", str(tmp_path / "student.json")])
    ours = found["ratios"][str(tmp_path / "teacher.json")]

    diff = [s - t for s, t in zip(found["record"]["by_position"]["block_nll"], teacher["by_position"]["block_nll"])]
    assert ours["all"]["ratio"] == pytest.approx(math.exp(statistics.mean(diff)), rel=1e-9)
    assert ours["all"]["stderr"] == pytest.approx(ours["all"]["ratio"] * statistics.stdev(diff) / math.sqrt(3))
    assert ours["all"]["ratio"] > 1.0  # an untrained far term beyond a 16-token window is worse than the teacher
    assert ours["sliding"]["ratio"] == pytest.approx(found["record"]["ppl"] / teacher["ppl"])
    assert set(ours) == {"sliding", "all", "0-63", "64-255", "256-511"}

    # a record read back gives the same ratios without a model; against itself, exactly 1 ± 0
    again = script.main([str(tmp_path / "student.json"), "--against", str(tmp_path / "student.json"),
                         str(tmp_path / "teacher.json")])["ratios"]  # fmt: skip  # packed args
    assert again[str(tmp_path / "teacher.json")] == ours
    assert again[str(tmp_path / "student.json")]["all"] == {**ours["all"], "ratio": 1.0, "log_ratio": 0.0,
                                                            "stderr_log": 0.0, "stderr": 0.0}  # fmt: skip


def test_records_of_different_blocks_are_refused_by_name(tmp_path, corpus):
    script = load_script("heldout_ppl")
    for tokens in ("1600", "1100"):
        script.main([str(TINYSTORIES), "--corpus", str(corpus), "--tokens", tokens, "--split", "validation",
                     "--output", str(tmp_path / f"{tokens}.json")])  # fmt: skip  # packed args
    with pytest.raises(SystemExit, match="1100.json: the results must score the same"):
        script.main([str(tmp_path / "1600.json"), "--against", str(tmp_path / "1100.json")])


def test_long_context_records_pair_context_by_context():
    """Two committed ``long.json`` records: every context's whole-block ratio equals the geometric mean of the
    per-block perplexity ratios computed by hand from their block NLL."""
    from tests.conftest import REPO

    folder = REPO / "docs" / "results" / "sliding_window" / "records"
    script = load_script("heldout_ppl")
    out = script.main([str(folder / "quickstart_lora_long.json"), "--against", str(folder / "quickstart_long.json")])
    found = out["ratios"][str(folder / "quickstart_long.json")]
    record, reference = out["record"]["contexts"], script.json.loads((folder / "quickstart_long.json").read_text())
    assert {key.split(":")[0] for key in found} == set(record) == {"512", "2048", "4096", "8192"}
    for context, blocks in record.items():
        logs = [a - b for a, b in zip(blocks["block_nll"], reference["contexts"][context]["block_nll"], strict=True)]
        assert found[f"{context}:all"]["ratio"] == pytest.approx(math.exp(statistics.mean(logs)), rel=1e-9)
        assert f"{context}:{list(blocks['buckets'])[-1]}" in found
