r"""``lit-dof chat``: a multi-turn conversation with a student through its tokenizer's chat template, each reply
streamed as it is decoded, with its speed and the bytes of the decode state after every turn; with
``--compare-teacher`` the teacher answers the same messages beside it.

    lit-dof chat runs/smoke/version_0/student
    printf 'Hi!\nWhat is the capital of France?\n' | lit-dof chat runs/smoke/version_0/student --max-new-tokens 32
    lit-dof chat runs/quickstart/version_0/student --compare-teacher --system "Answer in one sentence."

Input: one user message per line of stdin (a prompt ``>`` on stderr when stdin is a terminal); ``/exit``,
``/quit`` or the end of the input ends the conversation, empty lines are skipped. Each reply goes to stdout
(prefixed ``student:`` / ``teacher:`` with ``--compare-teacher``), one line of statistics per model and turn to
stderr::

    chat: turn <k> student: <n> new tokens in <t> s = <n/t> tokens/s; state <bytes> bytes at context <c> tokens
    (teacher KV cache at the same context: <bytes> bytes)

Decoding is :func:`lit_dof.generation.prompt_inputs` (the chat template with the generation prompt) and
transformers' ``generate`` with a :class:`transformers.TextStreamer`, as in ``lit-dof generate``.

**Memory across turns.** The decode state is *carried*, never re-prefilled: each turn passes the cache the
previous turn left to ``generate`` with the whole conversation's token ids, so only the new tokens (the last
reply's final token, the template's turn markers and the new message) are prefilled. A student's cache is a
recurrent state per linear layer plus, with a sliding window, the keys and values of the window and sink tokens:
it grows until the window is full and then keeps its size however long the conversation grows (its bytes:
:func:`lit_dof.students.state_bytes.decode_state_bytes`, printed after every turn).
The teacher's ``DynamicCache`` keeps every token's keys and values and grows with every turn (so do the softmax
layers of a hybrid). The conversation's token ids are the first turn's template output, the tokens generated and,
per later turn, the template's text after the assistant's message (:func:`continuation`): the chat template
applied to the whole conversation, with the replies as generated.
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TextIO

from lit_dof.devices import DeviceError
from lit_dof.generation import GenerationSettings, GenerationSettingsError, prompt_inputs, teacher_kv_nbytes

PROG = "lit-dof chat"

CHAT_SETTINGS = GenerationSettings(max_new_tokens=128)
"""How ``lit-dof chat`` decodes by default: up to 128 new tokens per reply, greedily, on the best device."""

BARE_FLAGS = ("--compare_teacher", "--do_sample")
"""Boolean options that may be given without a value (``--compare-teacher`` for ``--compare_teacher true``)."""

END_COMMANDS = ("/exit", "/quit")
"""Input lines that end the conversation (as does the end of the input)."""

EPILOG = (
    "Input: one message per line of stdin; /exit, /quit or the end of the input ends the chat. Example: "
    f"printf 'Hi!\\nAnd then?\\n' | {PROG} runs/smoke/version_0/student --max_new_tokens 32"
)
"""The end of ``lit-dof chat --help``."""

REPLY_MARK = "LITDOFREPLYMARK"
"""A stand-in for the last reply when the chat template is rendered to find the text that follows a reply."""


class ChatUsageError(GenerationSettingsError):
    """Options of ``lit-dof chat`` that cannot work (reported as a usage error, before or after loading)."""


def read_messages(stream: TextIO) -> Iterator[str]:
    """User messages from ``stream``: one per line, stripped; empty lines skipped; ``/exit``, ``/quit`` or the end
    of the input stop. A prompt ``>`` goes to stderr before each line when ``stream`` is a terminal.

    Args:
        stream: the input (``sys.stdin``).

    Yields:
        each message.
    """
    interactive = stream.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = stream.readline()
        if not line or line.strip() in END_COMMANDS:
            return
        if line.strip():
            yield line.strip()


def continuation(tokenizer, messages: list[dict], last_token: int) -> tuple[bool, str]:
    """How the conversation's token ids go on after the assistant's last reply, as the chat template writes it.

    The template's text after that reply is its end-of-turn marker, the user's new message and the generation prompt.
    A reply that ended with a special token the marker starts with (``<|im_end|>``, ``<|eot_id|>``) keeps it and
    the marker is not written twice; one that ended with a special token the template does not write after a reply
    (an end-of-text token) drops it — it is not in the cache, ``generate`` never feeds its last token back — so
    that the ids are the template's rendering of the conversation with the replies as generated.

    Args:
        tokenizer: the tokenizer with the chat template.
        messages: the conversation, ending with the assistant's last reply and the user's new message.
        last_token: the reply's last token id.

    Returns:
        ``(keep, text)``: whether the reply's last token stays, and the text to tokenize and append.
    """
    marked = [*messages[:-2], {**messages[-2], "content": REPLY_MARK}, messages[-1]]
    rendered = tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    after = rendered.rpartition(REPLY_MARK)[2]
    if last_token not in tokenizer.all_special_ids:  # cut by max_new_tokens: the template closes the turn
        return True, after
    end = tokenizer.decode([last_token])
    return (True, after[len(end) :]) if after.startswith(end) else (False, after)


class Conversation:
    """One model's side of a chat: its messages, every token id so far and the cache carried between turns.

    Args:
        model: a causal LM in eval mode (a student or a teacher).
        tokenizer: the tokenizer with the chat template (the student's, for the teacher beside it too).
        label: the name in the statistics (``student``, ``teacher``).
        generate_kwargs: passed to ``model.generate`` (max_new_tokens, do_sample, sampling options, pad_token_id).
        system: a system message to open the conversation with (``None``: the template's default, if any).
        prefix: printed to stdout before each reply (``""``: nothing).
    """

    def __init__(
        self, model, tokenizer, label: str, generate_kwargs: dict, system: str | None = None, prefix: str = ""
    ) -> None:
        self.model, self.tokenizer, self.label, self.prefix = model, tokenizer, label, prefix
        self.generate_kwargs = generate_kwargs
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.ids = None  # (1, T) every token of the conversation so far, the last reply's included
        self.cache = None
        self.turns = 0

    def _input_ids(self):
        """The conversation's token ids up to the generation prompt of the user's new message: ``(1, T)``."""
        import torch

        device = next(self.model.parameters()).device
        if self.ids is None:  # the first turn: the template itself
            return prompt_inputs(self.tokenizer, None, self.messages, self.label)["input_ids"].to(device)
        keep, text = continuation(self.tokenizer, self.messages, int(self.ids[0, -1]))
        new = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
        return torch.cat([self.ids if keep else self.ids[:, :-1], new], dim=1)

    def reply(self, message: str) -> dict:
        """Answer ``message``: stream the reply to stdout and print the turn's statistics to stderr.

        Args:
            message: the user's message.

        Returns:
            ``{"turn", "model" (the label), "text", "tokens" (the new ids), "input_ids" (the conversation before
            the reply), "prefill_tokens" (tokens run through the model before decoding), "seconds",
            "tokens_per_second", "state_bytes" (the cache after the turn), "context_tokens" (tokens in it),
            "teacher_kv_bytes"}``.
        """
        import torch
        from transformers import TextStreamer

        from lit_dof.interface import MODEL_CACHE_ARGUMENT
        from lit_dof.students.cache import cache_nbytes

        self.messages.append({"role": "user", "content": message})
        ids = self._input_ids()
        cached = 0 if self.cache is None else self.cache.get_seq_length()
        carried = {} if self.cache is None else {MODEL_CACHE_ARGUMENT: self.cache}
        if self.prefix:
            print(self.prefix, end="", flush=True)
        streamer = TextStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                streamer=streamer,
                return_dict_in_generate=True,
                **carried,
                **self.generate_kwargs,
            )
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
        seconds = time.perf_counter() - start
        self.turns += 1
        self.cache, self.ids = getattr(out, MODEL_CACHE_ARGUMENT), out.sequences
        new = out.sequences[0, ids.shape[1] :].tolist()
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        context, state = self.cache.get_seq_length(), cache_nbytes(self.cache)
        config = getattr(self.model.config, "text_config", None)
        teacher = state if config is None else teacher_kv_nbytes(config, context, self.model.dtype)
        rate = len(new) / seconds if seconds > 0 else float("inf")
        print(
            f"chat: turn {self.turns} {self.label}: {len(new)} new tokens in {seconds:.2f} s = {rate:.1f} tokens/s; "
            f"state {state} bytes at context {context} tokens (teacher KV cache at the same context: {teacher} "
            "bytes)",
            file=sys.stderr,
            flush=True,
        )
        return {
            "turn": self.turns,
            "model": self.label,
            "text": text,
            "tokens": new,
            "input_ids": ids[0].tolist(),
            "prefill_tokens": ids.shape[1] - cached,
            "seconds": seconds,
            "tokens_per_second": rate,
            "state_bytes": state,
            "context_tokens": context,
            "teacher_kv_bytes": teacher,
        }


def chat(
    model: str,
    messages: Iterable[str] | None = None,
    settings: GenerationSettings = CHAT_SETTINGS,
    system: str | None = None,
    compare_teacher: bool = False,
    teacher: str | None = None,
) -> list[dict]:
    """Chat with a student (or any model): answer each message in turn, carrying the decode state between turns;
    each reply is streamed with its tokens/s and the decode-state bytes (constant for a student).

    Args:
        model: an exported student directory (or any model ``lit-dof generate`` loads: a teacher alias, local
            directory, ``.gguf`` file or hub id).
        messages: the user's messages (default: :func:`read_messages` of stdin).
        settings: new tokens per reply, sampling, seed, device and dtype (on the command line, options of their
            own: ``--max_new_tokens``, ``--do_sample``, …; default: :data:`CHAT_SETTINGS`).
        system: a system message opening the conversation (default: none, or the template's own).
        compare_teacher: the teacher answers too, after the student, from its own conversation (same user messages,
            its own replies) through the student's tokenizer (``--compare_teacher`` alone means true).
        teacher: the teacher for ``compare_teacher`` (default: the one the student records, ``config.teacher``).

    Returns:
        one record per reply (:meth:`Conversation.reply`), the teacher's after the student's of each turn.

    Raises:
        DeviceError: an unknown ``device``/``dtype``, or CUDA where there is none.
        ChatUsageError: ``teacher`` without ``compare_teacher``, a tokenizer without a chat template, or
            ``compare_teacher`` with no teacher known (a model that is not a student, or a student that records none,
            and no ``teacher``).
        TeacherNotFoundError: the teacher cannot be found (:func:`lit_dof.load_teacher`).
    """
    where, parameters = settings.placement()
    if teacher is not None and not compare_teacher:
        raise ChatUsageError("--teacher only applies with --compare_teacher")

    from transformers import set_seed

    from lit_dof.evaluation.loading import is_student, load_model

    loaded, tokenizer = load_model(model, device=where, dtype=parameters)
    if not getattr(tokenizer, "chat_template", None):
        raise ChatUsageError(
            f"the tokenizer of {model} has no chat template, so it cannot chat: continue plain text with "
            "lit-dof generate --prompt"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    options = settings.generate_kwargs(pad)
    label = "student" if is_student(model) else "model"
    sides = [Conversation(loaded.eval(), tokenizer, label, options, system, f"{label}: " if compare_teacher else "")]
    if compare_teacher:
        source = teacher or (getattr(loaded.config, "teacher", None) if label == "student" else None)
        if not source:
            raise ChatUsageError(f"{model} records no teacher to compare with: name one with --teacher SOURCE")
        teacher_model = load_model(source, device=where, dtype=parameters)[0].eval()
        sides.append(Conversation(teacher_model, tokenizer, "teacher", options, system, "teacher: "))
    set_seed(settings.seed)
    records = []
    for message in read_messages(sys.stdin) if messages is None else messages:
        records += [side.reply(message) for side in sides]
    return records


def main(args: list[str] | None = None) -> None:
    """Entry of ``lit-dof chat`` (jsonargparse CLI over :func:`chat`, :class:`~lit_dof.generation.GenerationSettings`'s
    fields as options of their own; options spelt with ``-`` or ``_``, ``--compare-teacher`` and ``--do-sample``
    without a value).

    Args:
        args: the arguments after ``chat`` (default: ``sys.argv[2:]``).

    Raises:
        SystemExit: ``--help``, a usage error (bad options, device or dtype, no chat template, no teacher to
            compare with: message on stderr, code 2), or Ctrl-C (code 130, no traceback).
    """
    from lit_dof.help_text import command_cli, command_line

    args = command_line(sys.argv[2:] if args is None else args, BARE_FLAGS)
    try:
        command_cli(chat, args, PROG, flat=["settings"], skip=["messages"], epilog=EPILOG)
    except (DeviceError, GenerationSettingsError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except KeyboardInterrupt:
        print(file=sys.stderr)
        raise SystemExit(130) from None
