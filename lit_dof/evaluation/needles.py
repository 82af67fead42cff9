"""Synthetic retrieval examples beyond a student's exact window: passkey, needle-in-a-haystack variants and
associative recall, each sized in the model's own tokens and placed at a chosen depth.

Every example is a prompt ending where the answer starts (``"… The pass key is"``), the answer (``"68432"``; the
scorer and lm-eval's loglikelihood put the space before it) and what places it: ``context`` (prompt tokens + the
answer budget :data:`ANSWER_TOKENS`, ≤ the model's positions), ``depth`` (where the queried needle sits in the
haystack, 0 = first, 1 = last) and the needle's token position. The haystack is the filler of Mohtashami & Jaggi
(2023, "Landmark Attention", §4.2 passkey retrieval), which RULER (Hsieh et al. 2024, §3) also uses as its "noise"
haystack; the needles follow RULER's formats (NIAH: "One of the special magic numbers for {key} is: {value}.").

* ``passkey`` — a 5-digit pass key in the filler (Mohtashami & Jaggi's prompt).
* ``niah_single`` / ``niah_uuid`` — one needle whose value is a 7-digit number / a UUID (RULER niah_single).
* ``niah_multikey`` — the queried needle among 3 distractor needles with other keys (RULER niah_multikey).
* ``niah_multivalue`` — 4 values of one key at different depths, all asked for (RULER niah_multivalue).
* ``niah_multiquery`` — 4 needles, 2 of them asked for at once (RULER niah_multiquery).
* ``assoc_recall`` — a dense context of word–number pairs, then queries (multi-query associative recall,
  Arora et al. 2023, "Zoology", §3, in words): the earlier queries are answered, the last is scored.

Examples are deterministic in (task, seed, context, depth, trial) and independent of the order they are made in.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import asdict, dataclass
from typing import Callable

ANSWER_TOKENS = 64
"""Tokens a context keeps free for the answer: the prompt has ``context − ANSWER_TOKENS`` tokens."""

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""One unit of the haystack (Mohtashami & Jaggi 2023; RULER's "noise" haystack)."""

_ADJECTIVES = tuple(
    "amber brave calm dusty eager fancy gentle hollow icy jolly keen lively misty noble odd proud quiet "
    "rapid silent tidy upper vivid wise young bold crisp dark early fierce golden humble inner lucky "
    "mellow narrow plain".split()
)
_NOUNS = tuple(
    "anchor badger candle dolphin engine falcon garden harbor island jacket kettle ladder meadow needle "
    "orchard pepper quarry river saddle tunnel valley walrus yacht zebra basket cactus desert feather "
    "glacier helmet lantern marble otter".split()
)


@dataclass(frozen=True)
class RetrievalExample:
    """One prompt and what it asks for.

    Attributes:
        task: the task name (``passkey``, ``niah_single``, …).
        prompt: the text up to where the answer starts (no trailing space).
        answer: the expected continuation without its leading space (several answers joined by ``", "``).
        answers: every value the answer must contain (one for single-answer tasks).
        context: the context length in tokens the example was sized for (prompt + :data:`ANSWER_TOKENS`).
        prompt_tokens: the prompt's actual length in tokens.
        depth: the queried needle's depth in the haystack, in [0, 1].
        needle_token: the token position where the queried needle starts (distance to the prompt's end:
            ``prompt_tokens − needle_token``).
        trial: the example's index within its (context, depth) cell.
    """

    task: str
    prompt: str
    answer: str
    answers: tuple[str, ...]
    context: int
    prompt_tokens: int
    depth: float
    needle_token: int
    trial: int

    def to_dict(self) -> dict:
        """The example as a plain record (an lm-eval document)."""
        record = asdict(self)
        record["answers"] = list(self.answers)
        return record


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _fit_units(tokenizer, build: Callable[[int], str], target: int, limit: int | None = None) -> tuple[int, str]:
    """The largest ``n`` (≤ ``limit``) with ``build(n)`` at most ``target`` tokens (``build`` grows with ``n``), and
    its text.

    Raises:
        ValueError: ``build(0)`` alone exceeds ``target`` (a context too short for the task).
    """
    base = _count(tokenizer, build(0))
    if base > target:
        raise ValueError(f"a context of {target} prompt tokens is too short: the task's text alone takes {base}")
    per_unit = max(1.0, (_count(tokenizer, build(8)) - base) / 8)
    limit = float("inf") if limit is None else limit
    n = int(min(limit, max(0, int((target - base) / per_unit))))
    while n > 0 and _count(tokenizer, build(n)) > target:  # BPE merges at the seams: walk down to fit
        n = max(0, n - max(1, int((_count(tokenizer, build(n)) - target) / per_unit)))
    while n < limit and _count(tokenizer, build(n + 1)) <= target:
        n += 1
    return n, build(n)


def _haystack(units: int, needles: dict[int, list[str]]) -> str:
    """``units`` filler units with each needle sentence inserted before unit ``i`` (``i = units``: at the end)."""
    parts: list[str] = []
    for i in range(units + 1):
        parts.extend(needles.get(i, ()))
        if i < units:
            parts.append(FILLER)
    return " ".join(parts)


def _slot(depth: float, units: int) -> int:
    return min(units, max(0, round(depth * units)))


def _rng(task: str, seed: int, context: int, depth: float, trial: int) -> random.Random:
    return random.Random(f"{task}/{seed}/{context}/{depth:.6f}/{trial}")  # str seeds hash stably (sha512)


def _keys(rng: random.Random, count: int) -> list[str]:
    pairs = rng.sample(range(len(_ADJECTIVES) * len(_NOUNS)), count)
    return [f"{_ADJECTIVES[p // len(_NOUNS)]}-{_NOUNS[p % len(_NOUNS)]}" for p in pairs]


def _number(rng: random.Random, digits: int) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _needle_token(tokenizer, prompt: str, needle: str) -> int:
    return _count(tokenizer, prompt[: prompt.index(needle)].rstrip())


def passkey(tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0) -> RetrievalExample:
    """A 5-digit pass key hidden in the filler at ``depth`` (Mohtashami & Jaggi 2023, §4.2).

    Args:
        tokenizer: the model's tokenizer (sizes the prompt).
        context: context length in tokens (prompt + :data:`ANSWER_TOKENS`).
        depth: the needle's depth in [0, 1].
        trial: the example's index in its cell.
        seed: the task seed.

    Returns:
        the example.

    Raises:
        ValueError: a context too short for the task's text.
    """
    rng = _rng("passkey", seed, context, depth, trial)
    key = _number(rng, 5)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    head = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will "
        "quiz you about the important information there.\n"
    )
    tail = "\nWhat is the pass key? The pass key is"

    def build(units: int) -> str:
        return head + _haystack(units, {_slot(depth, units): [needle]}) + tail

    units, prompt = _fit_units(tokenizer, build, context - ANSWER_TOKENS)
    return RetrievalExample(
        "passkey",
        prompt,
        key,
        (key,),
        context,
        _count(tokenizer, prompt),
        depth,
        _needle_token(tokenizer, prompt, needle),
        trial,
    )


def _niah(
    task: str,
    tokenizer,
    context: int,
    depth: float,
    trial: int,
    seed: int,
    *,
    keys: int,
    values: int,
    queries: int,
    kind: str = "number",
) -> RetrievalExample:
    """RULER's NIAH: ``keys`` needles ("One of the special magic numbers for {key} is: {value}."), ``values`` per
    queried key, ``queries`` keys asked for; the first queried needle sits at ``depth``, the others at random depths.
    """
    rng = _rng(task, seed, context, depth, trial)
    names = _keys(rng, keys)
    value = (lambda: _uuid(rng)) if kind == "uuid" else (lambda: _number(rng, 7))
    noun = "uuids" if kind == "uuid" else "numbers"
    needles = [(name, value()) for name in names for _ in range(values if name in names[:queries] else 1)]
    asked = names[:queries]
    answers = tuple(v for name, v in needles if name in asked)
    placements = [depth] + [rng.random() for _ in needles[1:]]
    head = (
        f"Some special magic {noun} are hidden within the following text. Make sure to memorize it. I will "
        f"quiz you about the {noun} afterwards.\n"
    )
    if len(answers) == 1:
        question = (
            f"\nWhat is the special magic {noun[:-1]} for {asked[0]} mentioned in the provided text? The "
            f"special magic {noun[:-1]} for {asked[0]} mentioned in the provided text is"
        )
    else:
        listed = ", ".join(asked[:-1]) + f" and {asked[-1]}" if len(asked) > 1 else asked[0]
        question = (
            f"\nWhat are all the special magic {noun} for {listed} mentioned in the provided text? The "
            f"special magic {noun} for {listed} mentioned in the provided text are"
        )
    sentences = [f"One of the special magic {noun} for {name} is: {v}." for name, v in needles]

    def build(units: int) -> str:
        slots: dict[int, list[str]] = {}
        for sentence, at in zip(sentences, placements):
            slots.setdefault(_slot(at, units), []).append(sentence)
        return head + _haystack(units, slots) + question

    units, prompt = _fit_units(tokenizer, build, context - ANSWER_TOKENS)
    return RetrievalExample(
        task,
        prompt,
        ", ".join(answers),
        answers,
        context,
        _count(tokenizer, prompt),
        depth,
        _needle_token(tokenizer, prompt, sentences[0]),
        trial,
    )


def niah_single(tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0) -> RetrievalExample:
    """One needle with a 7-digit value (RULER niah_single). Arguments as :func:`passkey`."""
    return _niah("niah_single", tokenizer, context, depth, trial, seed, keys=1, values=1, queries=1)


def niah_uuid(tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0) -> RetrievalExample:
    """One needle with a UUID value (RULER niah_single with UUIDs). Arguments as :func:`passkey`."""
    return _niah("niah_uuid", tokenizer, context, depth, trial, seed, keys=1, values=1, queries=1, kind="uuid")


def niah_multikey(tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0) -> RetrievalExample:
    """The queried needle among 3 distractors with other keys (RULER niah_multikey). Arguments as :func:`passkey`."""
    return _niah("niah_multikey", tokenizer, context, depth, trial, seed, keys=4, values=1, queries=1)


def niah_multivalue(tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0) -> RetrievalExample:
    """4 values of one key, all asked for (RULER niah_multivalue). Arguments as :func:`passkey`."""
    return _niah("niah_multivalue", tokenizer, context, depth, trial, seed, keys=1, values=4, queries=1)


def niah_multiquery(tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0) -> RetrievalExample:
    """4 needles, 2 asked for at once (RULER niah_multiquery). Arguments as :func:`passkey`."""
    return _niah("niah_multiquery", tokenizer, context, depth, trial, seed, keys=4, values=1, queries=2)


def assoc_recall(
    tokenizer, context: int, depth: float, trial: int = 0, seed: int = 0, answered: int = 3
) -> RetrievalExample:
    """Multi-query associative recall in words (Zoology, Arora et al. 2023, §3): as many ``word-word: number``
    pairs as fit, then ``answered`` queries with their answers (the format) and the scored query, whose pair
    sits at ``depth``. Arguments as :func:`passkey`, plus ``answered`` (the answered queries before it)."""
    rng = _rng("assoc_recall", seed, context, depth, trial)
    names = _keys(rng, len(_ADJECTIVES) * len(_NOUNS))  # every key, in a random order
    values = [_number(rng, 4) for _ in names]
    head = "Each word below is followed by its number. Remember them.\n"

    def build(pairs: int) -> str:
        listed = "\n".join(f"{names[i]}: {values[i]}." for i in range(pairs))
        return head + listed + "\nNow recall the numbers.\n"

    pairs, listing = _fit_units(tokenizer, build, context - ANSWER_TOKENS - 12 * (answered + 1), limit=len(names))
    if pairs < answered + 1:
        raise ValueError(f"a context of {context} tokens holds {pairs} pairs; assoc_recall needs {answered + 1}")
    target = _slot(depth, pairs - 1)
    others = [i for i in rng.sample(range(pairs), min(pairs, answered + 1)) if i != target][:answered]
    prompt = listing + "".join(f"{names[i]}: {values[i]}.\n" for i in others) + f"{names[target]}:"
    needle = f"{names[target]}: {values[target]}."
    return RetrievalExample(
        "assoc_recall",
        prompt,
        values[target],
        (values[target],),
        context,
        _count(tokenizer, prompt),
        depth,
        _needle_token(tokenizer, prompt, needle),
        trial,
    )
