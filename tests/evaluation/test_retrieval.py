"""Retrieval tasks: examples sized in the model's tokens with the needle where asked, scored by greedy generation
(exact match) and by the answer's log-likelihood, reported per (context, depth) cell — and the bar: the embedded
teacher retrieves a pass key at 1k and 2k tokens, the window-64 + 4-sink control does not beyond its window."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lit_dof.evaluation import retrieval_data as rd
from lit_dof.evaluation.retrieval import beyond_exact, found, retrieval_cells, score_generation
from tests.conftest import TINYSTORIES


@pytest.fixture(scope="module")
def tokenizer():
    from lit_dof.teacher.loading import load_tokenizer

    return load_tokenizer(str(TINYSTORIES))


@pytest.mark.parametrize("task", list(rd.GENERATORS))
def test_examples_fill_their_context_and_hold_the_needle_at_its_depth(tokenizer, task):
    """The prompt fills the context less the answer budget (to within one filler unit), every expected value is in
    it, the queried needle's token position grows with depth, and examples are deterministic per seed."""
    made = rd.examples(task, tokenizer, contexts=(512, 768), depths=(0.0, 0.5, 1.0), trials=2)
    assert len(made) == 2 * 2 * 3 and [e.trial for e in made[:6]] == [0] * 6  # trial-major
    for e in made:
        budget = e.context - rd.ANSWER_TOKENS
        assert budget - 40 <= e.prompt_tokens <= budget, (e.context, e.prompt_tokens)
        assert len(tokenizer(e.prompt, add_special_tokens=False)["input_ids"]) == e.prompt_tokens
        assert all(answer in e.prompt for answer in e.answers) and e.answer == ", ".join(e.answers)
        assert not e.prompt.endswith(" ") and 0 <= e.needle_token < e.prompt_tokens
    for context in (512, 768):
        cell = [e for e in made if e.context == context and e.trial == 0]
        assert [e.needle_token for e in cell] == sorted(e.needle_token for e in cell)  # depth 0 → 0.5 → 1
        assert cell[-1].prompt_tokens - cell[-1].needle_token < cell[0].prompt_tokens - cell[0].needle_token
    again = rd.examples(task, tokenizer, contexts=(512, 768), depths=(0.0, 0.5, 1.0), trials=2)
    assert [e.prompt for e in again] == [e.prompt for e in made]
    other = rd.examples(task, tokenizer, contexts=(512,), depths=(0.5,), trials=1, seed=1)[0]
    assert other.answers != made[1].answers


def test_each_variant_holds_its_needles():
    """Counts of needles, distractors and asked values per variant (RULER's designs)."""
    from lit_dof.teacher.loading import load_tokenizer

    tok = load_tokenizer(str(TINYSTORIES))
    needles = {task: rd.GENERATORS[task](tok, 768, 0.5) for task in rd.GENERATORS}
    count = {task: e.prompt.count("One of the special magic") for task, e in needles.items()}
    assert count == {"passkey": 0, "niah_single": 1, "niah_uuid": 1, "niah_multikey": 4, "niah_multivalue": 4,
                     "niah_multiquery": 4, "assoc_recall": 0}  # fmt: skip  # one table
    assert [len(e.answers) for e in needles.values()] == [1, 1, 1, 1, 4, 2, 1]
    assert re.fullmatch(r"\d{5}", needles["passkey"].answer) and re.fullmatch(r"\d{7}", needles["niah_single"].answer)
    assert re.fullmatch(r"[0-9a-f-]{36}", needles["niah_uuid"].answer)
    assert needles["niah_multiquery"].prompt.endswith("mentioned in the provided text are")
    recall = needles["assoc_recall"]
    asked = recall.prompt.rsplit("\n", 1)[-1].removesuffix(":")
    assert f"{asked}: {recall.answer}." in recall.prompt and recall.prompt.count(f"{asked}:") == 2


def test_bad_grids_are_refused():
    with pytest.raises(ValueError, match="depths must lie in"):
        rd.RetrievalGrid(depths=(1.5,))
    with pytest.raises(ValueError, match="trials must be"):
        rd.RetrievalGrid(trials=0)
    with pytest.raises(ValueError, match="contexts must be"):
        rd.RetrievalGrid(contexts=(64,))
    with pytest.raises(ValueError, match="no retrieval context within the model's 512 positions"):
        rd.examples("passkey", None, contexts=(1024,), max_length=512)
    with pytest.raises(ValueError, match="unknown retrieval task"):
        rd.examples("needle", None)


def test_generation_scores_match_whole_values():
    assert found("68432", "The pass key is 68432. Remember it.") and not found("68432", " 684321")
    assert found("2fd52b1e-9673-43a5-b381-0c8d4d56455b", "is: 2FD52B1E-9673-43A5-B381-0C8D4D56455B.")
    assert score_generation(["1234567"], " 1234567.") == {"exact_match": 1.0, "recall": 1.0}
    assert score_generation(["1", "2", "3", "4"], " 1, 22, 3 and 44") == {"exact_match": 0.0, "recall": 0.5}
    with pytest.raises(ValueError):
        score_generation([], "anything")


def test_cells_group_by_context_and_depth_with_the_standard_error():
    docs = [{"context": c, "depth": d} for c in (2048, 1024) for d in (0.5, 0.0) for _ in range(3)]
    scores = [1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1]
    cells = retrieval_cells(docs, scores)
    assert list(cells) == ["1024", "2048"] and list(cells["1024"]) == ["0", "0.5"]
    two_of_three = cells["2048"]["0.5"]
    assert two_of_three["n"] == 3 and two_of_three["mean"] == pytest.approx(2 / 3)
    assert two_of_three["se"] == pytest.approx(math.sqrt((1 / 3) / 3))  # sample variance 1/3 over n = 3
    assert beyond_exact({"prompt_tokens": 1000, "needle_token": 900}, window=64, sink_tokens=4)
    assert not beyond_exact({"prompt_tokens": 1000, "needle_token": 950}, window=64, sink_tokens=4)
    assert not beyond_exact({"prompt_tokens": 1000, "needle_token": 2}, window=64, sink_tokens=4)


def test_lm_eval_runs_generation_and_loglikelihood_tasks_per_cell(tmp_path):
    """Through lm-eval on the tiny teacher: both scorings of the same examples, per-item records with their cells,
    ``limit`` = one trial per cell, and the heatmap PNG."""
    pytest.importorskip("lm_eval")
    from lit_dof.evaluation.cli import format_table
    from lit_dof.evaluation.harness import evaluate_model
    from lit_dof.evaluation.loading import load_model
    from lit_dof.evaluation.retrieval import heatmap

    model, tok = load_model(str(TINYSTORIES), device=torch.device("cpu"), dtype=None)
    grid = rd.RetrievalGrid(contexts=(384, 512, 4096), depths=(0.0, 1.0), trials=2)  # 4096 > the model's 512
    result = evaluate_model(model, tok, ["passkey", "passkey_ll"], retrieval=grid, limit=4, batch_size=2)
    generated, scored = result["tasks"]["passkey"], result["tasks"]["passkey_ll"]
    assert generated["n"] == scored["n"] == 4  # trial 0 of the four cells within 512 positions
    assert [(e["context"], e["depth"], e["trial"]) for e in generated["examples"]] == [
        (384, 0.0, 0), (384, 1.0, 0), (512, 0.0, 0), (512, 1.0, 0)]  # fmt: skip
    assert generated["examples"] == [{**e, "generation": g["generation"]} for e, g in
                                     zip(scored["examples"], generated["examples"])]  # fmt: skip  # same examples
    by_hand = [score_generation(e["answers"], e["generation"])["exact_match"] for e in generated["examples"]]
    assert generated["items"]["exact_match"] == by_hand and generated["exact_match"] == sum(by_hand) / 4
    assert set(scored["items"]) == {"acc", "loglikelihood"} and all(ll < 0 for ll in scored["items"]["loglikelihood"])
    assert generated["cells"]["384"]["0"]["n"] == 1 and result["provenance"]["retrieval"]["contexts"] == [
        384,
        512,
        4096,
    ]
    assert "| passkey | " in format_table(result)
    heatmap(generated["cells"], tmp_path / "passkey.png", title="passkey")
    assert (tmp_path / "passkey.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_teacher_finds_the_pass_key_and_the_window_control_does_not():
    """The bar: the embedded SmolLM2 teacher retrieves the pass key at 1k and 2k tokens (≥ 0.9 of the trials); the
    same teacher behind a 64-token window + 4 sinks (no far term) finds none beyond its window (≤ 0.1)."""
    pytest.importorskip("lm_eval")
    from lit_dof.attention import LearnedPRF, SlidingWindow
    from lit_dof.evaluation.harness import evaluate_model
    from lit_dof.students.modeling import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, tok = load_teacher("smollm2-135m-instruct")
    grid = rd.RetrievalGrid(contexts=(1024, 2048), depths=(0.2, 0.6), trials=1)
    result = evaluate_model(teacher, tok, ["passkey"], retrieval=grid, batch_size=1)["tasks"]["passkey"]
    for context in ("1024", "2048"):
        cell = result["cells"][context]
        assert sum(c["mean"] * c["n"] for c in cell.values()) / sum(c["n"] for c in cell.values()) >= 0.9, cell
    control = linearize(teacher, LearnedPRF, 1, sliding_window=SlidingWindow(window=64, sink_tokens=4, far_term=False))
    grid = rd.RetrievalGrid(contexts=(1024,), depths=(0.2, 0.6), trials=1)
    controlled = evaluate_model(control, tok, ["passkey"], retrieval=grid, batch_size=1)["tasks"]["passkey"]
    beyond = [s for e, s in zip(controlled["examples"], controlled["items"]["exact_match"]) if beyond_exact(e, 64, 4)]
    assert len(beyond) == 2 and sum(beyond) / len(beyond) <= 0.1, controlled["examples"]


def test_eval_runs_a_student_beside_its_controls(tmp_path, capsys):
    """``lit-dof eval --controls``: a window + sinks + linear student and its window-only, equal-state and far-only
    controls score the same retrieval examples; the record says what each control is, and each gets its heatmap."""
    pytest.importorskip("lm_eval")
    import json

    from lit_dof.cli import main
    from tests.evaluation.students import save_window_student

    save_window_student(tmp_path / "student")
    output = tmp_path / "eval.json"
    main(["eval", "--model", str(tmp_path / "student"), "--tasks", "[passkey]", "--retrieval.contexts", "[384]",
          "--retrieval.depths", "[0.5]", "--retrieval.trials", "2", "--device", "cpu", "--controls", "true",
          "--figures", str(tmp_path / "figures"), "--output", str(output)])  # fmt: skip  # packed args
    record = json.loads(output.read_text())
    assert set(record["controls"]) == {"window_sinks", "equal_state", "far_only"}  # untrained: no LoRA tail
    own = [{k: e[k] for k in ("context", "depth", "answers")} for e in record["tasks"]["passkey"]["examples"]]
    for name, entry in record["controls"].items():
        assert [
            {k: e[k] for k in ("context", "depth", "answers")} for e in entry["tasks"]["passkey"]["examples"]
        ] == own
        assert entry["control"]["name"] == name and entry["provenance"]["model"].endswith(f"[{name}]")
        assert (tmp_path / "figures" / name / "passkey.png").is_file()
    assert record["controls"]["window_sinks"]["control"]["window"] == 16
    assert (
        record["controls"]["far_only"]["control"]["window"],
        record["controls"]["far_only"]["control"]["sink_tokens"],
    ) == (1, 0)
    equal = record["controls"]["equal_state"]["control"]
    assert equal["window"] > 16 and equal["state_bytes"] <= equal["student_state_bytes"]
    assert "control equal_state" in capsys.readouterr().out
