"""A student beside its controls in ``lit-dof compare`` (rows ``<row>:window_sinks``, ``:equal_state``,
``:tail_only``, ``:far_only``), with the retrieval and long-document stages, over two seeds, on the tiny real
teacher."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import pytest
import torch
from transformers import AutoConfig

from lit_dof.comparison.beyond_window import seed_pairs
from lit_dof.comparison.cells import Comparison
from lit_dof.comparison.control_cells import describe_controls
from lit_dof.comparison.records import Report
from lit_dof.comparison.rows import ROWS, Row, control_rows
from lit_dof.evaluation.loading import load_model
from lit_dof.evaluation.retrieval_data import RetrievalGrid
from lit_dof.generation import teacher_kv_nbytes
from lit_dof.hybrid.recall_items import placed_items
from lit_dof.students.state_bytes import STATE_LAYOUT
from tests.comparison.test_comparison import DATA, TINY_FIT, run_compare
from tests.conftest import TINYSTORIES, WIKIPEDIA
from tests.evaluation.students import save_window_student

ROWS_CONTROLS = ("window_sinks", "equal_state", "tail_only", "far_only")
WINDOW = ["--model.init_args.sliding_window.window=16", "--model.init_args.sliding_window.sink_tokens=2"]


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    """The quickstart recipe (window 16 + 2 sinks, LoRA tail in the last step) at two seeds beside its controls."""
    out = tmp_path_factory.mktemp("controls") / "cells"
    kwargs = dict(rows=["teacher", "quickstart"], controls=["quickstart"], budgets=[16], out=str(out))
    kwargs.update(teacher=str(TINYSTORIES), corpus=str(WIKIPEDIA), data_dir=str(DATA), fit_args=[*TINY_FIT, *WINDOW])
    kwargs.update(stages=["fit", "ppl", "long_documents", "retrieval", "eval"], seeds=[0, 1], ppl_tokens=300)
    kwargs.update(long_documents=2, tasks=["wsc273", "mmlu_5shot"], eval_limit=4)
    kwargs.update(retrieval=RetrievalGrid(contexts=(256, 512), depths=(0.5,), trials=2))
    kwargs.update(retrieval_tasks=["passkey", "recall"])
    return out, kwargs, run_compare(**kwargs)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_controls_are_rows_measured_once_per_window(controlled):
    out, _, report = controlled
    cells = {(c["row"], c["seed"]): c for c in report["cells"]}
    rows = ["quickstart", *(f"quickstart:{n}" for n in ROWS_CONTROLS)]
    assert set(cells) == {("teacher", None)} | {(row, seed) for row in rows for seed in (0, 1)}
    config = AutoConfig.from_pretrained(TINYSTORIES)
    shared = set()
    for seed, student in ((0, out / "C16" / "quickstart"), (1, out / "C16" / "seed1" / "quickstart")):
        info = {n: json.loads((student / "controls" / n / "control.json").read_text()) for n in ROWS_CONTROLS}
        a, b, c, d = (info[n]["control"] for n in ROWS_CONTROLS)
        assert (d["window"], d["sink_tokens"], d["weights"]) == (1, 0, "student")
        assert (a["window"], a["sink_tokens"], a["weights"]) == (16, 2, "teacher")
        # (b): the largest window whose fp32 KV cache (window + sinks tokens, closed form) fits in the student's state
        state = b["student_state_bytes"]
        assert teacher_kv_nbytes(config, b["window"] + 2, torch.float32) <= state
        assert teacher_kv_nbytes(config, b["window"] + 3, torch.float32) > state
        assert b["window"] > a["window"] and c["weights"] == "student" and c["window"] is None
        assert info["tail_only"]["records"] is None  # the student's own weights: its own records
        for n in ("window_sinks", "equal_state"):  # the teacher's weights: one folder per window, shared by seeds
            folder = (student / "controls" / n / info[n]["records"]).resolve()
            assert folder.parent == (out / "controls").resolve() and (folder / "ppl.json").is_file()
            shared.add(folder.name)
        assert (student / "controls" / "tail_only" / "long_documents.json").is_file()
        assert (
            cells[("quickstart:window_sinks", seed)]["ppl"]
            == json.loads((out / "controls" / "teacher_window16_sinks2" / "ppl.json").read_text())["ppl"]
        )
    assert "teacher_window16_sinks2" in shared and len(shared) <= 3  # (b)'s window may differ by seed (dims)
    teacher = cells[("teacher", None)]
    tail = cells[("quickstart:tail_only", 0)]
    assert tail["ppl"] != teacher["ppl"] and tail["state"]["bytes"] == teacher["state"]["bytes"]  # full attention


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_retrieval_and_long_documents_are_reported_and_paired_over_seeds(controlled):
    out, _, report = controlled
    student = json.loads((out / "C16" / "quickstart" / "retrieval" / "passkey.json").read_text())
    assert student["n"] == 4 and set(student["cells"]) == {"256", "512"}
    assert (out / "C16" / "quickstart" / "retrieval" / "passkey.png").stat().st_size > 0
    assert all("beyond_window" in e for e in student["examples"])  # the needle at depth 0.5 of 256+ tokens
    assert all(e["beyond_window"] for e in student["examples"])  # is beyond 16 + 2 exact positions
    text = (out / "comparison.md").read_text()
    needles = ["Retrieval (greedy generation", "`passkey`:", "Long documents (2 whole documents"]
    needles += ["| quickstart:equal_state (seed 1) |", "against its reference and its controls over seeds"]
    for needle in needles:
        assert needle in text
    # over seeds: student / control, the geometric mean of the per-seed ratios of the ppl.json records
    pairs = {(p.student, p.other): p for p in seed_pairs(Report.from_json(report))}
    assert set(pairs) == {("quickstart", f"quickstart:{n}") for n in ROWS_CONTROLS}
    assert set(pairs[("quickstart", "quickstart:equal_state")].retrieval) == {"passkey", "recall"}
    records = {}
    for seed, student_dir in ((0, out / "C16" / "quickstart"), (1, out / "C16" / "seed1" / "quickstart")):
        control = json.loads((student_dir / "controls" / "equal_state" / "control.json").read_text())
        other = (student_dir / "controls" / "equal_state" / control["records"]).resolve()
        records[seed] = [json.loads((d / "ppl.json").read_text())["ppl"] for d in (student_dir, other)]
    expected = math.exp(sum(math.log(s / o) for s, o in records.values()) / 2)
    assert pairs[("quickstart", "quickstart:equal_state")].ppl["ratio"] == pytest.approx(expected, rel=1e-12)
    bucket = pairs[("quickstart", "quickstart:tail_only")].long_documents["0-63"]
    assert bucket["n"] == 2 and bucket["ratio"] > 0
    # tasks over seeds: student − control on each task's primary metric, from the eval records, paired by seed
    assert "Tasks: each student against its controls over seeds" in text
    for name in ("window_sinks", "tail_only"):
        scores = {}
        for seed, student_dir in ((0, out / "C16" / "quickstart"), (1, out / "C16" / "seed1" / "quickstart")):
            control = json.loads((student_dir / "controls" / name / "control.json").read_text())
            other = (student_dir / "controls" / name / (control["records"] or ".")).resolve()
            scores[seed] = [json.loads((d / "eval" / "wsc273.json").read_text())["acc"] for d in (student_dir, other)]
        expected = sum(s - o for s, o in scores.values()) / 2
        assert pairs[("quickstart", f"quickstart:{name}")].tasks["wsc273"]["difference"] == pytest.approx(expected)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_recall_is_the_answers_argmax_on_facts_placed_in_the_test_documents(controlled):
    out, kwargs, report = controlled
    teacher, tokenizer = load_model(str(TINYSTORIES))
    record = json.loads((out / "C16" / "teacher" / "retrieval" / "recall.json").read_text())
    assert record["split"] == "test" and record["n"] == 4 and set(record["cells"]) == {"256", "512"}
    expected, guesses = [], []
    for context in (256, 512):  # independently: the fact in the test documents at depth 0.5, the code's argmax
        for item in placed_items(WIKIPEDIA, tokenizer, context, [0.5], 2, split="test"):
            start, stop = item["answer"]
            with torch.no_grad():
                guess = teacher(item["input_ids"]).logits[0, start - 1 : stop - 1].argmax(-1)
            expected.append(float(torch.equal(guess, item["input_ids"][0, start:stop])))
            guesses.append(tokenizer.decode(guess))
            fact = tokenizer.decode(item["input_ids"][0, item["fact"] : item["fact"] + 8])
            assert abs(item["depth"] - 0.5) < 0.01 and fact.lstrip().startswith("The locker code")
    assert record["items"]["exact_match"] == expected and record["exact_match"] == sum(expected) / 4
    assert [e["generation"] for e in record["examples"]] == guesses  # the tiny teacher recalls none: its argmax
    student = json.loads((out / "C16" / "quickstart" / "retrieval" / "recall.json").read_text())
    assert all(e["beyond_window"] for e in student["examples"])  # depth 0.5 of 256+ tokens, window 16 + 2 sinks
    assert "`recall`:" in (out / "comparison.md").read_text()
    names = {f.name for f in fields(Comparison)}
    validation = Comparison(**{**{k: v for k, v in kwargs.items() if k in names}, "ppl_split": "validation"})
    with pytest.raises(ValueError, match="measured the test split, not the validation split"):
        validation.retrieval_stage(ROWS["teacher"], 16)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_controls_are_refused_for_rows_that_are_not_selected_students(controlled):
    _, kwargs, _ = controlled
    with pytest.raises(ValueError, match="name student rows that --rows selects"):
        run_compare(**{**kwargs, "controls": ["teacher"]})
    with pytest.raises(ValueError, match="name student rows that --rows selects"):
        run_compare(**{**kwargs, "controls": ["fix"]})
    with pytest.raises(ValueError, match="unknown retrieval task"):
        run_compare(**{**kwargs, "retrieval_tasks": ["needle"]})
    with pytest.raises(ValueError, match="only students have controls"):
        control_rows(ROWS["teacher"])
    with pytest.raises(ValueError, match="--control_kinds"):  # refused before any cell runs
        run_compare(**{**kwargs, "control_kinds": ["window_sinks", "equal_window"]})
    with pytest.raises(ValueError, match="unknown control kind"):
        control_rows(ROWS["quickstart"], ["tail"])


def test_control_kinds_select_controls_in_table_order():
    chosen = control_rows(ROWS["quickstart"], ["equal_state", "window_sinks"])
    assert [r.name for r in chosen] == ["quickstart:window_sinks", "quickstart:equal_state"]
    assert all(r.kind == "control" and r.reference == "quickstart" for r in chosen)
    assert [r.control for r in control_rows(ROWS["quickstart"])] == [
        "window_sinks",
        "equal_state",
        "tail_only",
        "far_only",
    ]


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_tasks_say_which_examples_reach_past_the_window_and_5_shot_mmlu_is_a_column(controlled):
    out, _, report = controlled
    assert report["tasks"][-1] == "mmlu_5shot" and "wsc273" in report["tasks"]
    teacher = json.loads((out / "C16" / "teacher" / "eval" / "mmlu_5shot.json").read_text())
    assert teacher["beyond_exact"] is None and teacher["provenance"]["exact_positions"] is None  # full attention
    for cell, exact in ((out / "C16" / "quickstart", 18), (out / "controls" / "teacher_window16_sinks2", 18)):
        for task in ("wsc273", "mmlu_5shot"):
            record = json.loads((cell / "eval" / f"{task}.json").read_text())
            assert record["provenance"]["exact_positions"] == exact
            assert record["beyond_exact"] == sum(t > exact for t in record["tokens"]) / len(record["tokens"])
    five_shot = json.loads((out / "C16" / "quickstart" / "eval" / "mmlu_5shot.json").read_text())
    assert five_shot["beyond_exact"] == 1.0  # five examples before the question: every prompt is past 18 tokens
    text = (out / "comparison.md").read_text()
    assert "Examples beyond the exact window" in text and "| quickstart | " in text
    assert "avg: the seven zero-shot tasks (not mmlu_5shot)" in text
    cells = {(c["row"], c["seed"]): c for c in report["cells"]}
    assert cells[("quickstart", 0)]["average"] is None  # two of the seven tasks: no average
    assert set(cells[("quickstart:window_sinks", 1)]["vs_reference"]) == {"wsc273", "mmlu_5shot"}  # paired per task


def test_a_hybrids_teacher_weight_controls_keep_its_softmax_layers_and_records_of_their_own(tmp_path, monkeypatch):
    """(a) of a student with layers kept softmax (or KV heads kept exact) is another model than (a) of one without at
    the same window + sinks: it must not read (or write) the other's shared records."""
    students = {
        "plain": save_window_student(tmp_path / "plain"),
        "hybrid": save_window_student(tmp_path / "hybrid", softmax_layers=(1,)),
        "heads": save_window_student(tmp_path / "heads", exact_heads={0: [1], 1: [0, 1]}),
    }
    monkeypatch.setattr(Comparison, "model_source", lambda self, row, budget: str(students[row.name]))
    comparison = Comparison(out=tmp_path / "cells", teacher=str(TINYSTORIES))
    folders = {}
    for name in students:
        row = Row(name=name)
        records = describe_controls(comparison, row, 16)
        for control in ("window_sinks", "equal_state"):
            assert (records[control].control.window > 0) and records[control].control.weights == "teacher"
            own = comparison.cell_dir(row, 16) / "controls" / control
            folders[name, control] = (own / records[control].records).resolve().name
    assert folders["plain", "window_sinks"] == "teacher_window16_sinks2"
    assert folders["hybrid", "window_sinks"] == "teacher_window16_sinks2_softmax1"
    assert folders["hybrid", "equal_state"].endswith("_softmax1") and "softmax" not in folders["plain", "equal_state"]
    assert folders["heads", "window_sinks"] == "teacher_window16_sinks2_exact0.1-1.0.1"
    assert folders["heads", "equal_state"].endswith("_exact0.1-1.0.1")
    # a control.json counted in an older decode-state layout (its (b) sized to other bytes) is described again
    path = comparison.cell_dir(Row(name="plain"), 16) / "controls" / "equal_state" / "control.json"
    current = json.loads(path.read_text())
    path.write_text(json.dumps({**current, "state_layout": None, "control": {**current["control"], "window": 999}}))
    assert (
        describe_controls(comparison, Row(name="plain"), 16)["equal_state"].control.window
        == current["control"]["window"]
    )
    assert json.loads(path.read_text()) == current and current["state_layout"] == STATE_LAYOUT
    assert json.loads(path.with_name("control.json.layout1").read_text())["control"]["window"] == 999  # kept beside
