"""Controls of a student: its decode-state bytes in closed form equal the bytes its real cache holds (prefill and
generate, before and after the window fills); the equal-state window is the largest whose teacher KV cache fits
in them (the quickstart's 4,919,856 bytes give 102 + 4 float32 tokens); control (a) is the student with
its far term weighted to zero and a float64 masked-softmax teacher; (c) is the student in teacher mode, or the
teacher itself without a LoRA tail; every control runs forward and ``generate`` with and without a cache."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.attention.ops.sliding_window.naive import naive_sliding_window_attention
from lit_dof.evaluation.controls import (
    closed_form_state_bytes,
    control_info,
    control_models,
    decode_state_bytes,
    equal_state_window,
    full_state_context,
    state_growth,
    tail_only_model,
    tuned_parameters,
)
from lit_dof.generation import teacher_kv_nbytes
from lit_dof.interface import MODEL_CACHE_ARGUMENT
from lit_dof.students import linearize
from lit_dof.students.cache import cache_nbytes, prefill_cache_nbytes
from lit_dof.students.lora import LoRA, add_lora, merged_state_dict
from lit_dof.students.surgery import exact_heads
from tests.conftest import REPO, TINYSTORIES, tiny_model

WINDOW = SlidingWindow(window=6, sink_tokens=2)
STUDENTS = {
    "window+sinks+linear": dict(feature_dims=[8, 12, 4], sliding_window=WINDOW),
    "pure-linear": dict(feature_dims=[8, 12, 4]),
    "window-per-head-dims-hybrid": dict(feature_dims=[[4, 8], 12, 6], sliding_window=WINDOW, softmax_layers=[2]),
    "pure-linear-per-query-head": dict(feature_dims=6, share_kv_maps=False),
    "window+sinks+exact-far-cache": dict(feature_dims=[8, 12, 4], sliding_window=replace(WINDOW, far_cache=3)),
    "window+sinks+heavy-hitters": dict(feature_dims=4, sliding_window=replace(WINDOW, far_term=False, far_cache=3)),
    "window+sinks+linear+novel-keys": dict(
        feature_dims=[8, 12, 4], sliding_window=replace(WINDOW, far_cache=3, far_cache_score="novelty")
    ),
    "window+exact-kv-heads": dict(feature_dims=[8, 12, 4], sliding_window=WINDOW, exact_heads={0: [1], 2: [0, 1]}),
    "window+unrotated-far-term": dict(feature_dims=[8, 12, 4], sliding_window=replace(WINDOW, far_rope=False)),
}


def _student(family="llama", dtype=torch.float32, **options):
    options = dict(options or STUDENTS["window+sinks+linear"])
    return linearize(tiny_model(family).to(dtype), LearnedPRF, options.pop("feature_dims"), **options).eval()


def _ids(length, seed=1):
    return torch.randint(3, 97, (1, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize(
    "variant, family",
    [(v, "llama") for v in STUDENTS] + [("window+unrotated-far-term", "gpt_neox")],  # partial rotary: r < d
)
def test_closed_form_equals_the_measured_cache(variant, family):
    student = _student(family, **STUDENTS[variant])
    for context in (4, 37):  # before the window (6 + 2 sinks) is full, and well after
        expected = closed_form_state_bytes(student, context)
        assert prefill_cache_nbytes(student, context) == expected
        assert decode_state_bytes(student, context) == expected  # short prefill + closed-form growth
        out = student.generate(_ids(3), max_new_tokens=context - 3, min_new_tokens=context - 3, do_sample=False,
                               return_dict_in_generate=True)  # fmt: skip
        cache = getattr(out, MODEL_CACHE_ARGUMENT)
        assert cache.get_seq_length() == context - 1  # the last token is generated, not yet cached
        assert cache_nbytes(cache) == closed_form_state_bytes(student, context - 1)


@torch.no_grad()
def test_state_depends_on_dtype_and_stops_growing_once_the_window_is_full():
    student, half = _student(), _student(dtype=torch.bfloat16)
    full = full_state_context(student)
    assert full == WINDOW.window + WINDOW.sink_tokens + 1
    assert decode_state_bytes(student, full) == decode_state_bytes(student, 200) == decode_state_bytes(student)
    assert decode_state_bytes(student, full - 1) < decode_state_bytes(student, full)
    assert decode_state_bytes(half, 20) == closed_form_state_bytes(half, 20) == prefill_cache_nbytes(half, 20)
    # only the window's and sinks' keys and values halve: 3 layers × 2 KV heads × 8 tokens × (16 + 16) × 2 bytes
    assert decode_state_bytes(student, 20) - decode_state_bytes(half, 20) == 3 * 2 * 8 * 32 * 2
    assert closed_form_state_bytes(student, 20, dtype=torch.bfloat16) == decode_state_bytes(half, 20)


@torch.no_grad()
@pytest.mark.parametrize("variant", list(STUDENTS))
def test_state_growth_is_what_the_measured_cache_adds_per_token(variant):
    student = _student(**STUDENTS[variant])
    full = full_state_context(student)
    measured = [prefill_cache_nbytes(student, t) for t in (full, full + 1, 40, 41)]
    assert state_growth(student) == measured[1] - measured[0] == measured[3] - measured[2]
    assert state_growth(student, 40) == measured[3] - measured[2]
    config = student.config.text_config  # a softmax layer keeps its KV cache: 2 · Hk · d fp32 numbers per token
    kv = 2 * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    exact = STUDENTS[variant].get("exact_heads", {})  # an exact KV head: 2 · d numbers, a flag per layer
    growth = kv * len(STUDENTS[variant].get("softmax_layers", ())) + sum(
        kv * len(heads) // config.num_key_value_heads + 1 for heads in exact.values()
    )
    assert state_growth(student) == growth


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_a_teachers_state_is_its_kv_cache(family):
    teacher = tiny_model(family)  # gemma3_text: sliding layers hold at most sliding_window - 1 tokens
    for context in (3, 40):
        assert decode_state_bytes(teacher, context) == teacher_kv_nbytes(teacher.config, context, torch.float32)
    assert decode_state_bytes(teacher, 40) == prefill_cache_nbytes(teacher, 40)
    assert state_growth(teacher, 40) == teacher_kv_nbytes(teacher.config, 41, torch.float32) - teacher_kv_nbytes(
        teacher.config, 40, torch.float32
    )  # gemma3_text: the global layers only, past the local window


@pytest.mark.parametrize("variant", ["window+sinks+linear", "pure-linear"])
@pytest.mark.parametrize("dtype", [None, torch.float32, torch.bfloat16])
def test_equal_state_window_is_the_largest_that_fits(variant, dtype):
    student = _student(**STUDENTS[variant])
    sinks = SlidingWindow.from_dict(student.config.window_options).sink_tokens
    state, kv = decode_state_bytes(student, 50), dtype or torch.float32
    window = equal_state_window(student, 50, dtype=dtype)
    config = student.config.text_config
    assert teacher_kv_nbytes(config, window + sinks, kv) <= state < teacher_kv_nbytes(config, window + sinks + 1, kv)
    with pytest.raises(ValueError, match="pass fewer sink_tokens"):
        equal_state_window(student, 50, sink_tokens=window + sinks)


def test_quickstart_state_follows_from_its_record():
    """A SmolLM2-135M-shaped student (built on the meta device: shapes only) with the quickstart's window, sinks,
    far term and committed feature dims. Its committed state (6,150,960 bytes, measured when the window kept its
    keys' log-features, 3 KV heads × 64 tokens × M float32 per layer) less those log-features plus the window
    keys' rotation angles kept instead (64 tokens × (32 + 1) float32 per layer) is what it holds now: the float32
    KV cache of 102 + 4 tokens (was 129 + 4)."""
    import transformers as tf

    fit = json.loads((REPO / "docs/results/sliding_window/records/quickstart_lora_fit.json").read_text())
    record = json.loads((REPO / "docs/results/sliding_window/records/quickstart_lora_ppl.json").read_text())["state"]
    config = tf.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)  # fmt: skip
    with torch.device("meta"):
        teacher = tf.AutoModelForCausalLM.from_config(config)
    window = SlidingWindow(window=64, sink_tokens=4, far_decay=128, far_rope=False)
    student = linearize(teacher, LearnedPRF, fit["feature_dims"], sliding_window=window)
    features, angles = 3 * 64 * sum(fit["feature_dims"]) * 4, 30 * 64 * (64 // 2 + 1) * 4
    assert record["bytes"] == 6_150_960
    assert closed_form_state_bytes(student, record["context"]) == record["bytes"] - features + angles == 4_919_856
    assert decode_state_bytes(student, measure=False) == 4_919_856  # the same at any full context
    assert equal_state_window(student, record["context"], dtype=torch.float32, measure=False) == 102
    assert equal_state_window(student, measure=False, dtype=torch.bfloat16) == 209


def _masked_teacher_logits(monkeypatch, ids, window, sinks):
    """Reference: the float64 teacher whose every attention layer is the naive float64 softmax over the exact
    (window + sinks) pairs (:func:`~lit_dof.attention.ops.sliding_window.naive.naive_sliding_window_attention`
    without a far term)."""
    from transformers.models.llama import modeling_llama

    calls = []

    def naive(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        calls.append(module.layer_idx)
        out = naive_sliding_window_attention(query, key, value, None, None, window=window, sink_tokens=sinks)
        return out.transpose(1, 2), None

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", naive)
    teacher = tiny_model("llama").double()
    teacher.set_attn_implementation("eager")
    logits = teacher(ids).logits
    assert calls == [0, 1, 2]
    return logits


@torch.no_grad()
def test_window_controls_are_the_masked_teacher_and_the_student_without_far_term(monkeypatch):
    student, ids = _student(), _ids(20)
    with torch.no_grad():
        for twin in student.linear_modules().values():
            twin.log_mix.fill_(-1e4)  # far term weighted e^-10000 = 0: the student's own window-only computation
    teacher = tiny_model("llama")
    before = teacher(ids).logits
    controls = control_models(student, teacher)
    assert list(controls) == ["window_sinks", "equal_state", "far_only"]  # no tail: the weights are the teacher's
    torch.testing.assert_close(controls["window_sinks"](ids).logits, student(ids).logits)
    torch.testing.assert_close(teacher(ids).logits, before, rtol=0, atol=0)  # the teacher is left as it was
    student = _student(dtype=torch.float64)
    double = control_models(student, tiny_model("llama").double())
    double.pop("far_only")  # the student's weights (test_far_only_is_the_student_without_its_window)
    for name, control in double.items():
        info = control_info(control)
        full = equal_state_window(student) + WINDOW.sink_tokens + 1  # every state but a full KV cache is full there
        assert (info.name, info.weights, info.context) == (name, "teacher", full)
        reference = _masked_teacher_logits(monkeypatch, ids, info.window, info.sink_tokens)
        torch.testing.assert_close(control(ids).logits, reference, rtol=1e-10, atol=1e-10)
    info = control_info(double["equal_state"])
    assert info.window == equal_state_window(student) > WINDOW.window and info.sink_tokens == WINDOW.sink_tokens
    assert info.state_bytes <= info.student_state_bytes == decode_state_bytes(student)
    assert control_info(double["window_sinks"]).window == WINDOW.window


@torch.no_grad()
def test_window_controls_keep_the_students_exact_heads():
    """(a) and (b) keep the student's exact KV heads; (b)'s window
    is the largest whose KV cache — its windowed heads' W' + s tokens, the exact heads' whole context — fits in the
    student's bytes."""
    options = STUDENTS["window+exact-kv-heads"]
    student = _student(**options)
    controls = control_models(student, tiny_model("llama"))
    for name in ("window_sinks", "equal_state"):
        assert exact_heads(controls[name].model) == options["exact_heads"]
    info = control_info(controls["equal_state"])
    assert info.student_state_bytes == decode_state_bytes(student, info.context)
    head = 2 * 16 * 4  # one KV head's key and value per token, float32 (d = 16)
    windowed, exact = 3 * 2 - 3, 3  # KV heads of the 3 layers × 2 that keep a window, and the exact ones

    def kv_bytes(window):
        return head * (windowed * (window + WINDOW.sink_tokens) + exact * info.context)

    assert kv_bytes(info.window) <= info.student_state_bytes < kv_bytes(info.window + 1)


@torch.no_grad()
@pytest.mark.parametrize("variant", ["window+sinks+linear", "window-per-head-dims-hybrid"])
def test_far_only_is_the_student_without_its_window(variant):
    """(d) equals a student built at window 1 and no sinks with the same weights; the student keeps its window."""
    options = dict(STUDENTS[variant])
    student, ids = _student(**options), _ids(20)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if ".lit_dof." in f".{name}":
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    before = student(ids).logits
    control = control_models(student, tiny_model("llama"))["far_only"]
    alone = _student(**(options | {"sliding_window": SlidingWindow(window=1, sink_tokens=0)}))
    alone.load_state_dict(student.state_dict())
    torch.testing.assert_close(control(ids).logits, alone(ids).logits, rtol=0, atol=0)
    assert (control(ids).logits - before).abs().max() > 1e-3  # the window mattered
    torch.testing.assert_close(student(ids).logits, before, rtol=0, atol=0)  # the student keeps its window
    info = control_info(control)
    assert (info.name, info.window, info.sink_tokens, info.weights) == ("far_only", 1, 0, "student")
    assert "far_only" not in control_models(_student(**STUDENTS["pure-linear"]), tiny_model("llama"))


def _lora_students():
    """A student with live, trained LoRA adapters and its export (the adapters merged into plain weights)."""
    live = _student()
    add_lora(live.model, LoRA(rank=2, alpha=4.0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in live.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    exported = _student()
    exported.load_state_dict(merged_state_dict(live))
    return live, exported


@torch.no_grad()
def test_tail_only_is_the_student_in_teacher_mode_or_the_teacher():
    ids, teacher = _ids(15), tiny_model("llama")
    live, exported = _lora_students()
    tuned = tuned_parameters(exported, teacher)
    assert tuned and {name.split(".")[-2] for name in tuned} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    controls = control_models(exported, teacher)
    assert list(controls) == ["window_sinks", "equal_state", "far_only", "tail_only"]
    with exported.teacher_mode():
        reference = exported(ids).logits
    torch.testing.assert_close(controls["tail_only"](ids).logits, reference)
    torch.testing.assert_close(tail_only_model(live, teacher)(ids).logits, reference, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(reference, teacher(ids).logits, atol=1e-3)
    info = control_info(controls["tail_only"])
    assert (info.window, info.weights) == (None, "student")
    assert info.state_bytes == teacher_kv_nbytes(teacher.config, info.context, torch.float32)
    plain = _student()  # no tail: (c) is the teacher itself
    assert tuned_parameters(plain, teacher) == []
    torch.testing.assert_close(tail_only_model(plain, teacher)(ids).logits, teacher(ids).logits, rtol=0, atol=0)
    assert list(control_models(plain, teacher, tail=True)) == ["window_sinks", "equal_state", "far_only", "tail_only"]


@torch.no_grad()
def test_every_control_generates_and_runs_with_and_without_a_cache():
    _, exported = _lora_students()
    controls = control_models(exported, tiny_model("llama"), context=30)
    ids = _ids(9)  # 9 + 8 new tokens: past the window and sinks
    for name, control in controls.items():
        torch.testing.assert_close(control(ids, use_cache=True).logits, control(ids, use_cache=False).logits)
        out = [control.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, use_cache=use_cache)
               for use_cache in (True, False)]  # fmt: skip
        torch.testing.assert_close(out[0], out[1], rtol=0, atol=0, msg=name)
        assert control_info(control).context == 30


def test_pure_linear_student_gets_an_equal_state_window_without_sinks():
    student = _student(**STUDENTS["pure-linear"])
    controls = control_models(student, tiny_model("llama"))
    assert list(controls) == ["equal_state"]  # no window of its own: (a) would attend to nothing
    info = control_info(controls["equal_state"])
    window = equal_state_window(student)  # bytes counted where its window is full: W' + 0 sinks + 1 tokens
    assert (info.sink_tokens, info.window, info.context) == (0, window, window + 1)
    assert info.state_bytes <= info.student_state_bytes == decode_state_bytes(student)
    with_sinks = control_info(control_models(student, tiny_model("llama"), sink_tokens=2)["equal_state"])
    assert (with_sinks.sink_tokens, with_sinks.window) == (2, info.window - 2)


@torch.no_grad()
def test_the_recorded_teacher_is_loaded():
    from lit_dof.teacher.loading import load_teacher

    teacher, _ = load_teacher(str(TINYSTORIES))
    student = linearize(teacher, LearnedPRF, 8, sliding_window=WINDOW).eval()
    controls = control_models(student)  # loads config.teacher: the TinyStories directory
    ids = _ids(12)
    assert list(controls) == ["window_sinks", "equal_state", "far_only"]
    torch.testing.assert_close(controls["window_sinks"](ids).logits, controls["window_sinks"](ids).logits)
    assert control_info(controls["equal_state"]).window == equal_state_window(student)


def test_errors_name_the_problem_and_the_fix():
    student = _student()
    with pytest.raises(ValueError, match="records no teacher"):
        control_models(student)
    with pytest.raises(ValueError, match="do not match the student's architecture"):
        control_models(student, tiny_model("qwen2"))
    with pytest.raises(ValueError, match="student's dtype and device"):
        control_models(student, tiny_model("llama").to(torch.bfloat16))
    with pytest.raises(ValueError, match="twins attached"):
        control_models(student, _student().model)
    with pytest.raises(TypeError, match="load_student"):
        control_models(tiny_model("llama"))
    with pytest.raises(ValueError, match="tokens >= 1"):
        decode_state_bytes(student, 0)
    with pytest.raises(ValueError, match="tail must be"):
        control_models(student, tiny_model("llama"), tail="yes")
