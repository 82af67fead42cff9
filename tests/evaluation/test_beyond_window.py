"""Tasks that reach the far term: 5-shot MMLU (prompts past a student's exact window) and, per task, the share of
examples longer than the positions a student attends exactly — the only examples on which it can differ from its
teacher."""

from __future__ import annotations

import csv
import json

import pytest

from lit_dof.evaluation import task_data
from lit_dof.evaluation.retrieval import beyond_exact_share, exact_positions
from tests.conftest import DATA, TINYSTORIES

pytestmark = pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")


def test_five_shot_mmlu_puts_the_subjects_first_five_dev_questions_before_each_question():
    zero = task_data.mmlu(DATA, per_subject=2)
    five = task_data.mmlu_5shot(DATA, per_subject=2)
    assert len(five) == len(zero) == 2 * 57 and [d["gold"] for d in five] == [d["gold"] for d in zero]
    subject = five[0]["subject"]
    with (DATA / "mmlu" / "dev" / f"{subject}_dev.csv").open(newline="", encoding="utf-8") as handle:
        dev = list(csv.reader(handle))[:5]
    description, question = zero[0]["query"].split("\n\n", 1)  # the zero-shot prompt: description, question
    solved = "".join(
        f"{q.strip()}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer: {answer.strip()}\n\n" for q, a, b, c, d, answer in dev
    )
    assert five[0]["query"] == f"{description}\n\n{solved}{question}"
    assert task_data.load_task("mmlu_5shot", DATA, per_subject=1)[0]["query"] == five[0]["query"]


def test_exact_positions_of_students_controls_and_teachers():
    from lit_dof.attention import LearnedPRF, SlidingWindow
    from lit_dof.students.modeling import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, _ = load_teacher(str(TINYSTORIES))
    assert exact_positions(teacher) is None  # full attention: nothing is beyond
    windowed = linearize(teacher, LearnedPRF, 4, sliding_window=SlidingWindow(window=16, sink_tokens=2), seed=0)
    assert exact_positions(windowed) == 18
    assert exact_positions(linearize(load_teacher(str(TINYSTORIES))[0], LearnedPRF, 4, seed=0)) == 0
    assert beyond_exact_share([10, 18, 19, 400], 18) == 0.5 and beyond_exact_share([10], None) is None


def test_eval_reports_each_tasks_share_beyond_the_students_window(tmp_path, capsys):
    """``lit-dof eval`` of a window-16 + 2-sink student: each example's longest request in tokens (as the tokenizer
    counts context + continuation) and the share over 18 tokens, in the table and the record."""
    pytest.importorskip("lm_eval")
    from lit_dof.cli import main
    from lit_dof.teacher.loading import load_tokenizer
    from tests.evaluation.students import save_window_student

    tok = load_tokenizer(str(save_window_student(tmp_path / "student")))
    output = tmp_path / "eval.json"
    main(
        [
            "eval",
            "--model",
            str(tmp_path / "student"),
            "--tasks",
            "[wsc273, arc_easy]",
            "--limit",
            "6",
            "--data_dir",
            str(DATA),
            "--device",
            "cpu",
            "--output",
            str(output),
        ]
    )
    record = json.loads(output.read_text())
    assert record["provenance"]["exact_positions"] == 18
    for task in ("arc_easy", "wsc273"):  # a choice task and a partial one: request_texts is what lm-eval scores
        docs = task_data.load_task(task, DATA)[:6]
        by_hand = [
            max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in task_data.request_texts(d)) for d in docs
        ]
        entry = record["tasks"][task]
        assert entry["tokens"] == by_hand and entry["beyond_exact"] == sum(t > 18 for t in by_hand) / 6
    assert "beyond 18 tokens" in capsys.readouterr().out


def test_the_lengths_script_needs_no_model(tmp_path):
    """``tools/task_lengths.py``: per task, the lengths of its requests and the share beyond the exact positions."""
    from lit_dof.teacher.loading import load_tokenizer
    from tests.conftest import load_script

    args = ["--tokenizer", str(TINYSTORIES), "--exact", "20", "--tasks", "wsc273", "--data_dir", str(DATA)]
    result = load_script("task_lengths", "tools").main([*args, "--output", str(tmp_path / "l.json")])
    tok = load_tokenizer(str(TINYSTORIES))
    lengths = [
        max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in task_data.request_texts(d))
        for d in task_data.wsc273(DATA)
    ]
    entry = result["tasks"]["wsc273"]
    assert (
        entry["n"] == 273
        and entry["max"] == max(lengths)
        and entry["beyond_exact"] == sum(n > 20 for n in lengths) / 273
    )
    assert json.loads((tmp_path / "l.json").read_text())["tasks"] == result["tasks"]
