"""``lit-dof chat`` on the real TinyStories teacher and a sliding-window + linear student of it (with a chat template
put on its tokenizer): the first reply is ``model.generate``'s on the templated prompt, later turns carry the
cache and answer as a fresh ``generate`` on the whole conversation would, the student's state bytes stay constant
from turn to turn while the teacher's KV cache grows, and bad options are refused."""

from __future__ import annotations

import io
import re
import sys

import pytest
import torch

from lit_dof.chat import ChatUsageError, chat, continuation, read_messages
from lit_dof.generation import GenerationSettings, teacher_kv_nbytes
from tests.conftest import TINYSTORIES, run_lit_dof

pytestmark = pytest.mark.skipif(not TINYSTORIES.is_dir(), reason="needs ../shared/models/TinyStories-656K")

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A plain chat template: after a reply, ``\\n<role>: <content>`` per message, then ``assistant:``."""

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's template without its default system message: a reply ends with its end-of-turn token."""

STATS = re.compile(
    r"chat: turn (\d+) (student|teacher): (\d+) new tokens in ([\d.]+) s = ([\d.]+) tokens/s; state (\d+) bytes at "
    r"context (\d+) tokens \(teacher KV cache at the same context: (\d+) bytes\)"
)
MESSAGES = ["Tell me a story about a cat.", "What did the cat do next?", "How did it end?"]
NEW = 6


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    """A LearnedPRF student of TinyStories: exact attention over 8 tokens and 2 sinks plus the linear far term,
    saved with the teacher's tokenizer and :data:`TEMPLATE`."""
    from lit_dof.attention import LearnedPRF, SlidingWindow
    from lit_dof.students import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, tokenizer = load_teacher(TINYSTORIES)
    path = tmp_path_factory.mktemp("chat") / "student"
    linearize(teacher, LearnedPRF, 8, sliding_window=SlidingWindow(window=8, sink_tokens=2), seed=0).save_pretrained(
        path
    )
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def _greedy(model, ids: list[int]) -> list[int]:
    """The new tokens of a fresh greedy ``model.generate`` on ``ids`` (no cache carried)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def test_turns_are_model_generate_on_the_templated_conversation_and_the_student_state_is_constant(capsys, student_dir):
    from lit_dof.evaluation.loading import load_model

    records = chat(str(student_dir), MESSAGES, GenerationSettings(NEW, device="cpu"), compare_teacher=True)
    out, err = capsys.readouterr()
    student, tokenizer = load_model(str(student_dir))
    teacher = load_model(str(TINYSTORIES))[0]
    assert [(r["turn"], r["model"]) for r in records] == [(t, m) for t in (1, 2, 3) for m in ("student", "teacher")]
    first = tokenizer(f"user: {MESSAGES[0]}\nassistant:", add_special_tokens=False)["input_ids"]
    for model, record in ((student, records[0]), (teacher, records[1])):
        assert record["input_ids"] == first  # the template with the generation prompt, as the tokenizer renders it
    for name, model in (("student", student), ("teacher", teacher)):
        turns = [r for r in records if r["model"] == name]
        for previous, record in zip([None, *turns], turns):
            if previous is not None:  # the conversation so far, then the template's text after the reply
                follow = f"\nuser: {MESSAGES[record['turn'] - 1]}\nassistant:"
                carried = previous["input_ids"] + previous["tokens"]
                carried = carried[:-1] if carried[-1] == tokenizer.eos_token_id else carried  # not the template's
                assert record["input_ids"] == carried + tokenizer(follow, add_special_tokens=False)["input_ids"]
                assert record["prefill_tokens"] == len(record["input_ids"]) - previous["context_tokens"]
            assert record["tokens"] == _greedy(model, record["input_ids"])  # the carried cache = a fresh prefill
            assert len(record["tokens"]) == NEW and record["text"] == tokenizer.decode(record["tokens"], True)
            assert record["context_tokens"] == len(record["input_ids"]) + NEW - 1  # the last token is not fed back
            assert record["teacher_kv_bytes"] == teacher_kv_nbytes(
                teacher.config, record["context_tokens"], torch.float32
            )
        states = [r["state_bytes"] for r in turns]
        if name == "student":  # constant: recurrent state + window ring buffer, whatever the conversation's length
            assert len(set(states)) == 1 and 0 < states[0] < turns[-1]["teacher_kv_bytes"]
        else:  # the teacher's KV cache grows with every turn
            assert states == [r["teacher_kv_bytes"] for r in turns] and states[0] < states[1] < states[2]
    stats = [STATS.fullmatch(line) for line in err.splitlines() if line.startswith("chat:")]
    assert len(stats) == 6 and all(stats)
    assert [(int(s[1]), s[2], int(s[3]), int(s[6])) for s in stats] == [
        (r["turn"], r["model"], len(r["tokens"]), r["state_bytes"]) for r in records
    ]
    assert out == "".join(f"{r['model']}: {r['text']}\n" for r in records)  # streamed, one line per reply


def test_the_command_reads_stdin_until_exit(capsys, monkeypatch, student_dir):
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{MESSAGES[0]}\n\n{MESSAGES[1]}\n/exit\nnever read\n"))
    options = ["--max-new-tokens", str(NEW), "--system", "Be brief.", "--device", "cpu"]  # - or _ alike
    code, out, err = run_lit_dof(capsys, monkeypatch, "chat", str(student_dir), *options)
    assert code == 0, err
    stats = [STATS.fullmatch(line) for line in err.splitlines() if line.startswith("chat:")]
    assert [(s[1], s[2]) for s in stats] == [("1", "student"), ("2", "student")]
    expected = chat(str(student_dir), MESSAGES[:2], GenerationSettings(NEW, device="cpu"), system="Be brief.")
    capsys.readouterr()
    assert out == "".join(f"{r['text']}\n" for r in expected)  # no label without --compare-teacher
    from lit_dof.teacher.loading import load_tokenizer

    opening = f"system: Be brief.\nuser: {MESSAGES[0]}\nassistant:"  # the system message opens the conversation
    assert expected[0]["input_ids"] == load_tokenizer(str(student_dir))(opening, add_special_tokens=False)["input_ids"]


def test_help_and_usage_errors(capsys, monkeypatch, student_dir):
    code, out, _ = run_lit_dof(capsys, monkeypatch, "chat", "--help")
    assert code == 0 and out.startswith("usage: lit-dof chat ") and "--compare_teacher" in out and "model" in out
    assert "--max_new_tokens" in out and "default: 128" in out  # GenerationSettings' options, chat's default
    for args, message in (
        (["--temperature", "0.5"], "--temperature only apply when sampling: add --do_sample"),
        (["--teacher", str(TINYSTORIES)], "--teacher only applies with --compare_teacher"),
        (["--max-new-tokens", "0"], "--max_new_tokens must be at least 1"),
        (["--max_new_tokens", "0"], "--max_new_tokens must be at least 1"),
    ):
        code, out, err = run_lit_dof(capsys, monkeypatch, "chat", str(student_dir), *args)
        assert code == 2 and not out and f"lit-dof chat: error: {message}" in err
    with pytest.raises(ChatUsageError, match="has no chat template"):  # TinyStories' own tokenizer has none
        chat(str(TINYSTORIES), [], GenerationSettings(device="cpu"))
    with pytest.raises(ChatUsageError, match="records no teacher to compare with: name one with --teacher"):
        _no_teacher(student_dir)


def _no_teacher(student_dir):
    """``chat`` with ``--compare-teacher`` on a student that records no teacher."""
    import json
    import shutil

    copy = student_dir.parent / "no_teacher"
    if not copy.exists():
        shutil.copytree(student_dir, copy)
        config = json.loads((copy / "config.json").read_text())
        config["teacher"] = None
        (copy / "config.json").write_text(json.dumps(config))
    chat(str(copy), [], GenerationSettings(device="cpu"), compare_teacher=True)


def test_the_conversation_continues_as_the_template_writes_it():
    from lit_dof.teacher.loading import load_tokenizer

    tokenizer = load_tokenizer(str(TINYSTORIES))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    im_end, end_story, word = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id, 300
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    tokenizer.chat_template = CHATML
    follow = "\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    assert continuation(tokenizer, messages, im_end) == (True, follow)  # ended by the template's own marker
    assert continuation(tokenizer, messages, word) == (True, "<|im_end|>" + follow)  # cut at max_new_tokens
    assert continuation(tokenizer, messages, end_story) == (False, "<|im_end|>" + follow)  # not the template's
    tokenizer.chat_template = TEMPLATE
    assert continuation(tokenizer, messages, end_story) == (False, "\nuser: Bye\nassistant:")
    assert continuation(tokenizer, messages, word) == (True, "\nuser: Bye\nassistant:")


def test_messages_are_lines_until_exit_or_end_of_input():
    assert list(read_messages(io.StringIO("a\n\n  b  \n/quit\nc\n"))) == ["a", "b"]
    assert list(read_messages(io.StringIO("a\nb"))) == ["a", "b"]
    assert list(read_messages(io.StringIO(""))) == []
