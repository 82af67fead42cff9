"""``lit-dof generate`` on the real TinyStories teacher and a student made from it: the greedy text is
``model.generate``'s, the statistics line is printed, a student's cache is constant in the context length
while the teacher's grows, and bad options are refused before any model loads."""

from __future__ import annotations

import json
import re

import pytest
import torch

from lit_dof.generation import (
    GenerateUsageError,
    GenerationSettings,
    GenerationSettingsError,
    generate,
    parse_messages,
    prompt_inputs,
    teacher_kv_nbytes,
)
from lit_dof.help_text import command_line
from tests.conftest import TINYSTORIES, run_lit_dof

pytestmark = pytest.mark.skipif(not TINYSTORIES.is_dir(), reason="needs ../shared/models/TinyStories-656K")

STATS = re.compile(
    r"generate: (\d+) new tokens in ([\d.]+) s = ([\d.]+) tokens/s; cache (\d+) bytes at context "
    r"(\d+) tokens \(teacher KV cache at the same context: (\d+) bytes\)"
)
PROMPT = "Once upon a time, there was a little girl"


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    """A LearnedPRF student of TinyStories (8 features), saved with its tokenizer."""
    from lit_dof.attention import LearnedPRF
    from lit_dof.students import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, tokenizer = load_teacher(TINYSTORIES)
    path = tmp_path_factory.mktemp("generate") / "student"
    linearize(teacher, LearnedPRF, 8, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _lit_dof(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """``lit-dof ARGS`` through the real entry point: (exit code, stdout, stderr)."""
    return run_lit_dof(capsys, monkeypatch, *args)


def _direct(source, prompt: str, max_new_tokens: int) -> list[int]:
    """The greedy new tokens of ``model.generate`` called directly."""
    from lit_dof.evaluation.loading import load_model

    model, tokenizer = load_model(str(source))
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0, ids["input_ids"].shape[1] :].tolist(), tokenizer


@pytest.mark.parametrize("which", ["teacher", "student"])
def test_greedy_generate_prints_model_generate_text_and_statistics(capsys, monkeypatch, student_dir, which):
    source = str(TINYSTORIES if which == "teacher" else student_dir)
    expected, tokenizer = _direct(source, PROMPT, 24)
    for stream in ([], ["--no_stream"]):
        code, out, err = _lit_dof(capsys, monkeypatch, "generate", "--model", source, "--prompt", PROMPT,
                                  "--max_new_tokens", "24", "--device", "cpu", *stream)  # fmt: skip  # packed args
        assert code == 0, err
        assert out.strip() and out.rstrip("\n") == tokenizer.decode(expected, skip_special_tokens=True)
        stats = STATS.search(err)
        assert stats, err
        assert int(stats[1]) == len(expected) and float(stats[3]) > 0
    result = generate(model=source, prompt=PROMPT, settings=GenerationSettings(24, device="cpu"), no_stream=True)
    assert result["tokens"] == expected and result["student"] == (which == "student")
    assert result["context_tokens"] == result["prompt_tokens"] + len(expected) - 1  # the last token is not fed back


def test_student_cache_is_constant_in_the_context_while_the_teachers_grows(capsys, student_dir):
    short, long = "Once upon a time", PROMPT + " who loved to play in the park with her big red ball every day"
    runs = {
        (which, prompt): generate(model=str(source), prompt=prompt, settings=GenerationSettings(8, device="cpu"))
        for which, source in (("teacher", TINYSTORIES), ("student", student_dir))
        for prompt in (short, long)
    }
    capsys.readouterr()
    student = [runs["student", p] for p in (short, long)]
    teacher = [runs["teacher", p] for p in (short, long)]
    assert student[0]["context_tokens"] < student[1]["context_tokens"]
    assert student[0]["cache_bytes"] == student[1]["cache_bytes"] > 0  # constant-size recurrent states
    assert teacher[0]["cache_bytes"] < teacher[1]["cache_bytes"]  # a growing KV cache
    for t in teacher:  # a teacher's own figures: its DynamicCache, equal to the config's formula
        assert t["teacher_kv_bytes"] == t["cache_bytes"]
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(TINYSTORIES)
    assert [teacher_kv_nbytes(config, t["context_tokens"], torch.float32) for t in teacher] == [
        t["cache_bytes"] for t in teacher
    ]
    for s in student:  # the student's teacher figure: the formula at the student's context, > its own cache
        assert s["teacher_kv_bytes"] == teacher_kv_nbytes(config, s["context_tokens"], torch.float32)
        assert s["teacher_kv_bytes"] > s["cache_bytes"]


def test_messages_without_a_chat_template_are_refused_clearly(capsys, monkeypatch, student_dir):
    from lit_dof.teacher.loading import load_tokenizer

    assert not getattr(load_tokenizer(str(TINYSTORIES)), "chat_template", None)  # TinyStories has none
    messages = json.dumps([{"role": "user", "content": "Tell me a story."}])
    for source in (TINYSTORIES, student_dir):
        code, out, err = _lit_dof(
            capsys, monkeypatch, "generate", "--model", str(source), "--messages", messages, "--device", "cpu"
        )
        assert code == 2 and not out
        assert "lit-dof generate: error: the tokenizer of" in err and "has no chat template" in err
        assert "--prompt" in err


def test_messages_go_through_the_chat_template_with_the_generation_prompt(tmp_path):
    from lit_dof.teacher.loading import load_tokenizer

    tokenizer = load_tokenizer(str(TINYSTORIES))
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    file = tmp_path / "chat.json"
    file.write_text(json.dumps([{"role": "user", "content": "Tell me a story."}]))
    inputs = prompt_inputs(tokenizer, None, parse_messages(str(file)), "m")
    expected = tokenizer("user: Tell me a story.\nassistant:", add_special_tokens=False)["input_ids"]
    assert inputs["input_ids"][0].tolist()[-len(expected) :] == expected
    assert inputs["attention_mask"].shape == inputs["input_ids"].shape


@pytest.mark.parametrize("text", ["not json", "[]", '[{"role": "user"}]', '"hello"'])
def test_malformed_messages_are_refused(text):
    with pytest.raises(GenerateUsageError, match="--messages"):
        parse_messages(text)


def _no_loading(monkeypatch):
    from lit_dof.evaluation import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(loading, "load_model", refuse)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "x", "--device", "tpu"], "device 'tpu': use auto, cpu, cuda or cuda:N"),
        (["--prompt", "x", "--device", "cuda:x"], "use auto, cpu, cuda or cuda:N"),
        (["--prompt", "x", "--dtype", "float64"], "'auto', 'float32', 'bfloat16', 'float16'"),
        ([], "exactly one of --prompt"),
        (["--prompt", "x", "--messages", "[]"], "exactly one of --prompt"),
        (["--prompt", "x", "--top_p", "0.9"], "add --do_sample"),
        (["--prompt", "x", "--max_new_tokens", "0"], "at least 1"),
    ],
)
def test_bad_options_are_refused_before_any_model_loads(capsys, monkeypatch, args, message):
    _no_loading(monkeypatch)
    code, _, err = _lit_dof(capsys, monkeypatch, "generate", "--model", str(TINYSTORIES), *args)
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_where_there_is_none_is_refused(capsys, monkeypatch):
    _no_loading(monkeypatch)
    code, _, err = _lit_dof(
        capsys, monkeypatch, "generate", "--model", str(TINYSTORIES), "--prompt", "x", "--device", "cuda"
    )
    assert code == 2 and "torch sees no CUDA device: use --device cpu" in err


def test_options_take_dashes_and_bare_boolean_flags_get_a_value():
    flags = ("--do_sample", "--no_stream")
    assert command_line(["--do_sample", "--no_stream"], flags) == ["--do_sample", "true", "--no_stream", "true"]
    assert command_line(["--do-sample", "false", "--prompt", "--no-stream"], flags) == [
        "--do_sample",
        "false",
        "--prompt",
        "--no_stream",
        "true",
    ]
    assert command_line(["--top-p=0.9", "--max-new-tokens", "3", "x-y"]) == [
        "--top_p=0.9",
        "--max_new_tokens",
        "3",
        "x-y",
    ]


def test_settings_refuse_what_cannot_decode():
    with pytest.raises(GenerationSettingsError, match="--max_new_tokens must be at least 1, got 0"):
        GenerationSettings(0)
    with pytest.raises(GenerationSettingsError, match="--top_p --top_k only apply when sampling: add --do_sample"):
        GenerationSettings(top_p=0.9, top_k=5)
    settings = GenerationSettings(8, do_sample=True, top_k=5)
    assert settings.generate_kwargs(0) == {"max_new_tokens": 8, "do_sample": True, "pad_token_id": 0, "top_k": 5}


def test_sampling_is_reproducible_with_a_seed(capsys):
    runs = [
        generate(
            model=str(TINYSTORIES),
            prompt=PROMPT,
            settings=GenerationSettings(12, do_sample=True, temperature=1.5, top_k=50, seed=seed, device="cpu"),
        )
        for seed in (1, 1, 2)
    ]
    capsys.readouterr()
    assert runs[0]["tokens"] == runs[1]["tokens"] != runs[2]["tokens"]
