"""``lit-dof generate``: text from a teacher, an exported student or a hybrid, streamed as it is decoded, with
its speed and the memory its cache holds beside what the teacher's KV cache would hold at the same context.

    lit-dof generate --model smollm2-135m-instruct --prompt "Once upon a time"
    lit-dof generate --model runs/quickstart/version_0/student --prompt "Once upon a time" --max_new_tokens 32
    lit-dof generate --model smollm2-135m-instruct --messages '[{"role": "user", "content": "Hi!"}]'
    lit-dof generate --model DIR --prompt "…" --do_sample --temperature 0.7 --top_p 0.9 --seed 1

``--prompt`` is plain text the model continues; ``--messages`` (a JSON list of ``{"role", "content"}``, or a
file holding one) goes through the tokenizer's chat template with the generation prompt added. Decoding is
transformers' ``generate`` (greedy unless ``--do_sample``) with a :class:`transformers.TextStreamer`; a student
decodes from its own constant-size cache (:meth:`~lit_dof.students.LitDofForCausalLM.new_cache`: a recurrent
state per linear layer, a KV cache per softmax layer of a hybrid). The continuation goes to stdout, one line
of statistics to stderr::

    generate: <n> new tokens in <t> s = <n/t> tokens/s; cache <bytes> bytes at context <c> tokens (teacher KV cache
    at the same context: <bytes> bytes)

For a teacher both figures are its ``DynamicCache``, measured from its tensors; for a student the first is
measured (the recurrent states' ``nbytes`` and any softmax layers' keys and values) and the teacher's is
computed from the teacher's config (:func:`teacher_kv_nbytes`).

The options ``lit-dof generate`` and ``lit-dof chat`` share (new tokens, sampling, seed, device, dtype) are the
fields of :class:`GenerationSettings`, declared once; either command takes them spelt with ``-`` or ``_``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lit_dof.devices import DeviceError, resolve_device, resolve_model_dtype
from lit_dof.precision import DtypeName
from lit_dof.teacher import DEFAULT_TEACHER

PROG = "lit-dof generate"

BARE_FLAGS = ("--do_sample", "--no_stream")
"""Boolean options that may be given without a value (``--do_sample`` for ``--do_sample true``)."""


class GenerationSettingsError(ValueError):
    """Decoding options that cannot work together (reported as a usage error by ``generate`` and ``chat``)."""


class GenerateUsageError(GenerationSettingsError):
    """Options of ``lit-dof generate`` that cannot work together (reported as a usage error)."""


@dataclass(frozen=True)
class GenerationSettings:
    """How a model decodes: how many new tokens, greedy or sampled, on which device and in which dtype.

    Args:
        max_new_tokens: the most tokens to generate (per reply, in a chat; fewer where the model ends its text or
            turn).
        do_sample: sample instead of decoding greedily (``--do_sample`` alone means true).
        temperature: sampling temperature (with ``do_sample``; default: the model's generation config).
        top_p: nucleus sampling's probability mass (with ``do_sample``).
        top_k: sample among the k most likely tokens (with ``do_sample``).
        seed: the random seed of sampling.
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``auto`` (the model's own: float32 for a teacher, the recorded dtype for a student), ``float32``,
            ``bfloat16`` or ``float16``.

    Raises:
        GenerationSettingsError: ``max_new_tokens`` < 1, or sampling options without ``do_sample``.
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0
    device: str = "auto"
    dtype: DtypeName = "auto"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise GenerationSettingsError(f"--max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.sampling() and not self.do_sample:
            raise GenerationSettingsError(f"--{' --'.join(self.sampling())} only apply when sampling: add --do_sample")

    def sampling(self) -> dict:
        """The sampling options given: ``{"temperature", "top_p", "top_k"}``, those not ``None``."""
        given = (("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k))
        return {name: value for name, value in given if value is not None}

    def generate_kwargs(self, pad_token_id: int | None) -> dict:
        """The arguments of ``model.generate`` these settings give: ``max_new_tokens``, ``do_sample``, the
        sampling options given and ``pad_token_id``."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "pad_token_id": pad_token_id,
            **self.sampling(),
        }

    def placement(self) -> tuple:
        """``(torch.device, torch.dtype | None)`` of :attr:`device` and :attr:`dtype` (``None``: the model's own).

        Raises:
            DeviceError: an unknown device or dtype, or CUDA where there is none.
        """
        return resolve_device(self.device), resolve_model_dtype(self.dtype)


def parse_messages(messages: str) -> list[dict]:
    """Chat messages from ``--messages``: a JSON list of ``{"role": ..., "content": ...}``, or a file holding one.

    Args:
        messages: the JSON text, or the path of a JSON file.

    Returns:
        the messages.

    Raises:
        GenerateUsageError: not valid JSON, or not a non-empty list of objects with ``role`` and ``content``.
    """
    text = Path(messages).read_text() if len(messages) < 4096 and Path(messages).is_file() else messages
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GenerateUsageError(
            f"--messages is neither a JSON file nor JSON text ({exc}); expected "
            '\'[{"role": "user", "content": "..."}]\''
        ) from exc
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not (
        isinstance(parsed, list)
        and parsed
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in parsed)
    ):
        raise GenerateUsageError('--messages must be a non-empty JSON list of {"role": ..., "content": ...} objects')
    return parsed


def teacher_kv_nbytes(config, tokens: int, dtype, batch: int = 1) -> int:
    """Bytes the teacher's ``DynamicCache`` holds at ``tokens`` tokens of context, from its config: keys and values,
    2 × kv_heads × head_dim × bytes(dtype) per token and layer; full-attention layers keep every token, sliding-window
    layers (``layer_types``) at most ``sliding_window − 1``, as transformers' ``DynamicSlidingWindowLayer`` does.

    Args:
        config: the teacher's (text) config.
        tokens: context length T.
        dtype: the cache's dtype (the teacher's weights' dtype).
        batch: sequences decoded together.

    Returns:
        the number of bytes.
    """
    import torch

    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    held = sum(min(tokens, window - 1) if kind == "sliding_attention" and window else tokens for kind in layer_types)
    return 2 * batch * kv_heads * head_dim * held * torch.empty((), dtype=dtype).element_size()


def prompt_inputs(tokenizer, prompt: str | None, messages: list[dict] | None, model: str) -> dict:
    """The model inputs of a plain prompt, or of chat messages through the tokenizer's chat template.

    Args:
        tokenizer: the model's tokenizer.
        prompt: plain text to continue (or None).
        messages: chat messages (or None).
        model: the model's source, for the error message.

    Returns:
        ``{"input_ids": (1, T), "attention_mask": (1, T)}``.

    Raises:
        GenerateUsageError: messages for a tokenizer without a chat template.
    """
    if messages is None:
        return dict(tokenizer(prompt, return_tensors="pt"))
    if not getattr(tokenizer, "chat_template", None):
        raise GenerateUsageError(
            f"the tokenizer of {model} has no chat template, so --messages cannot be formatted: "
            "pass the text with --prompt instead"
        )
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def generate(
    model: str = DEFAULT_TEACHER,
    prompt: str | None = None,
    messages: str | None = None,
    settings: GenerationSettings = GenerationSettings(),  # noqa: B008 (frozen)
    no_stream: bool = False,
) -> dict:
    """Generate a continuation of ``prompt`` (or a reply to ``messages``), print it and one line of statistics.

    Args:
        model: a teacher (alias such as ``smollm2-135m-instruct``, local directory, ``.gguf`` file, hub id) or an
            exported student / hybrid directory.
        prompt: plain text for the model to continue.
        messages: chat messages through the tokenizer's chat template: a JSON list of ``{"role": ..., "content":
            ...}`` objects, or a file holding one.
        settings: new tokens, sampling, seed, device and dtype (on the command line, options of their own:
            ``--max_new_tokens``, ``--do_sample``, …).
        no_stream: print the text once at the end instead of token by token (``--no_stream`` alone means true).

    Returns:
        ``{"text", "tokens" (the new token ids), "prompt_tokens", "seconds", "tokens_per_second", "cache_bytes",
        "context_tokens", "teacher_kv_bytes", "student"}``.

    Raises:
        DeviceError: an unknown ``device``/``dtype``, or CUDA where there is none.
        GenerateUsageError: not exactly one of ``prompt``/``messages``, bad messages, messages for a tokenizer
            without a chat template.
    """
    where, parameters = settings.placement()
    if (prompt is None) == (messages is None):
        raise GenerateUsageError("pass exactly one of --prompt TEXT and --messages JSON_OR_FILE")
    chat = parse_messages(messages) if messages is not None else None

    import torch
    from transformers import TextStreamer, set_seed

    from lit_dof.evaluation.loading import is_student, load_model
    from lit_dof.interface import MODEL_CACHE_ARGUMENT
    from lit_dof.students.cache import cache_nbytes

    student = is_student(model)
    loaded, tokenizer = load_model(model, device=where, dtype=parameters)
    loaded.eval()
    inputs = {k: v.to(where) for k, v in prompt_inputs(tokenizer, prompt, chat, model).items()}
    streamer = None if no_stream else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    set_seed(settings.seed)
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    start = time.perf_counter()
    with torch.no_grad():
        out = loaded.generate(
            **inputs, **settings.generate_kwargs(pad), streamer=streamer, return_dict_in_generate=True
        )
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    seconds = time.perf_counter() - start
    new = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    text = tokenizer.decode(new, skip_special_tokens=True)
    if no_stream:
        print(text, flush=True)
    cache = getattr(out, MODEL_CACHE_ARGUMENT)
    context = cache.get_seq_length()
    cache_bytes = cache_nbytes(cache)
    if student:
        teacher_bytes = teacher_kv_nbytes(loaded.config.text_config, context, loaded.dtype)
    else:
        teacher_bytes = cache_bytes  # the teacher's own DynamicCache
    rate = len(new) / seconds if seconds > 0 else float("inf")
    print(
        f"generate: {len(new)} new tokens in {seconds:.2f} s = {rate:.1f} tokens/s; cache {cache_bytes} bytes at "
        f"context {context} tokens (teacher KV cache at the same context: {teacher_bytes} bytes)",
        file=sys.stderr,
        flush=True,
    )
    return {
        "text": text,
        "tokens": new,
        "prompt_tokens": inputs["input_ids"].shape[1],
        "seconds": seconds,
        "tokens_per_second": rate,
        "cache_bytes": cache_bytes,
        "context_tokens": context,
        "teacher_kv_bytes": teacher_bytes,
        "student": student,
    }


def main(args: list[str] | None = None) -> None:
    """Entry of ``lit-dof generate`` (jsonargparse CLI over :func:`generate`, :class:`GenerationSettings`'s fields as
    options of their own; options spelt with ``-`` or ``_``).

    Args:
        args: the arguments after ``generate`` (default: ``sys.argv[2:]``).

    Raises:
        SystemExit: ``--help``, or a usage error (bad device/dtype, prompt/messages, sampling options: message
            on stderr, code 2).
    """
    from lit_dof.help_text import command_cli, command_line

    args = command_line(sys.argv[2:] if args is None else args, BARE_FLAGS)
    try:
        command_cli(generate, args, PROG, flat=["settings"], as_positional=False, fail_untyped=False)
    except (DeviceError, GenerationSettingsError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
