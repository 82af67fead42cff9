"""Readers for the paper's seven zero-shot tasks in their original file formats (paper §5, Table 3).

Each reader returns plain records in one of two shapes, ready for lm-eval's ``multiple_choice`` output type:

* **choice** tasks (PIQA, LogiQA, ARC-Easy, ARC-Challenge, MMLU): ``{"query", "choices", "gold"}`` — the
  prompt, the answer strings scored as continuations of it, and the index of the right one;
* **partial** tasks (WinoGrande, WSC273, "partial evaluation" of Trinh & Le 2018): ``{"contexts",
  "continuation", "gold"}`` — the sentence up to the blank/pronoun with each option substituted, and the
  shared rest of the sentence, whose likelihood is compared across the contexts.

Prompts follow lm-eval's built-in task definitions (``arc_easy``, ``piqa``, ``logiqa``, ``mmlu``,
``winogrande``, ``wsc273``), so scores are comparable with published lm-eval numbers. File layouts and
quirks are those of the original releases (docs/usage.md, "Task data layout"): ARC answer keys may be
digits, WSC answers carry a trailing "." in 36 schemas, WSC273 is the first 273 of the 285 schemas, LogiQA
comes in 8-line records.
Every reader raises :class:`FileNotFoundError` naming the missing file and the expected layout.
"""

from __future__ import annotations

import csv
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from lit_dof.errors import CommandError

TASKS = ("piqa", "logiqa", "arc_easy", "arc_challenge", "winogrande", "wsc273", "mmlu")
"""The seven task names, in the paper's column order."""

EXPECTED_COUNTS = {
    "piqa": 1838,
    "logiqa": 651,
    "arc_easy": 2376,
    "arc_challenge": 1172,
    "winogrande": 1267,
    "wsc273": 273,
    "mmlu": 14042,
}
"""Evaluation-set sizes of the original releases (SOURCES.md)."""


def _file(data_dir: str | Path, relative: str) -> Path:
    path = Path(data_dir).expanduser() / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"missing task file {path}: point data_dir (or $LIT_DOF_DATA) at a folder in the task data layout "
            f"(docs/usage.md, 'Task data layout'), e.g. <data_dir>/{relative}"
        )
    return path


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def piqa(data_dir: str | Path) -> list[dict]:
    """PIQA validation (1838): ``valid.jsonl`` ``{goal, sol1, sol2}`` + ``valid-labels.lst`` (0/1 per line)."""
    docs = _jsonl(_file(data_dir, "piqa/valid.jsonl"))
    labels = _file(data_dir, "piqa/valid-labels.lst").read_text().split()
    if len(labels) != len(docs):
        raise ValueError(f"PIQA: {len(docs)} questions but {len(labels)} labels")
    return [
        {"query": f"Question: {d['goal']}\nAnswer:", "choices": [d["sol1"], d["sol2"]], "gold": int(y)}
        for d, y in zip(docs, labels)
    ]


def logiqa(data_dir: str | Path, split: str = "Test") -> list[dict]:
    """LogiQA English ``Test.txt`` (651): 8-line records — blank, answer letter, passage, question, options
    ``A.``…``D.``."""
    lines = _file(data_dir, f"logiqa/{split}.txt").read_text(encoding="utf-8").split("\n")
    docs = []
    for start in range(0, len(lines) - 7, 8):
        block = lines[start : start + 8]
        if block[0].strip():
            raise ValueError(f"LogiQA {split}.txt line {start + 1}: expected the blank line that starts a record")
        letter, passage, question = block[1].strip().lower(), block[2].strip(), block[3].strip()
        options = [
            option.strip()[2:].strip() if option.strip()[1:2] == "." else option.strip() for option in block[4:8]
        ]
        prompt = f"Passage: {passage}\nQuestion: {question}\nChoices:\n"
        prompt += "".join(f"{label}. {option}\n" for label, option in zip("ABCD", options)) + "Answer:"
        docs.append({"query": prompt, "choices": options, "gold": "abcd".index(letter)})
    return docs


def arc(data_dir: str | Path, subset: str = "Easy", split: str = "Test") -> list[dict]:
    """ARC-Easy (2376) / ARC-Challenge (1172) test, original JSONL; answer keys may be letters or digits."""
    docs = []
    for d in _jsonl(_file(data_dir, f"arc/ARC-{subset}-{split}.jsonl")):
        labels = [c["label"] for c in d["question"]["choices"]]
        docs.append(
            {
                "query": f"Question: {d['question']['stem']}\nAnswer:",
                "choices": [c["text"] for c in d["question"]["choices"]],
                "gold": labels.index(d["answerKey"]),
            }
        )
    return docs


def arc_easy(data_dir: str | Path) -> list[dict]:
    """ARC-Easy test documents: :func:`arc` with ``subset="Easy"``, the reader of ``arc_easy``."""
    return arc(data_dir, "Easy")


def arc_challenge(data_dir: str | Path) -> list[dict]:
    """ARC-Challenge test documents: :func:`arc` with ``subset="Challenge"``, the reader of ``arc_challenge``."""
    return arc(data_dir, "Challenge")


def winogrande(data_dir: str | Path, split: str = "dev") -> list[dict]:
    """WinoGrande v1.1 dev (1267): the blank ``_`` is filled with each option (partial evaluation)."""
    docs = []
    for d in _jsonl(_file(data_dir, f"winogrande/{split}.jsonl")):
        blank = d["sentence"].index("_")
        docs.append(
            {
                "contexts": [d["sentence"][:blank] + d["option1"], d["sentence"][:blank] + d["option2"]],
                "continuation": d["sentence"][blank + 1 :].strip(),
                "gold": int(d["answer"]) - 1,
            }
        )
    return docs


_UPPER_PRONOUNS = {"A", "An", "The", "She", "He", "It", "They", "My", "His", "Her", "Their"}


def wsc273(data_dir: str | Path) -> list[dict]:
    """WSC273 (the first 273 schemas of ``WSCollection.xml``): the pronoun is replaced by each candidate.

    As lm-eval's ``wsc273``: possessive pronouns turn candidates into possessives (``'s``), and a candidate's
    leading determiner is lower-cased unless the pronoun starts a sentence. Answers ``A``/``B`` may carry a
    trailing ``.``.
    """
    root = ET.fromstring(_file(data_dir, "wsc273/WSCollection.xml").read_bytes())
    docs = []
    for schema in root.findall("schema")[:273]:
        before = " ".join(schema.find("text/txt1").text.split())
        pronoun = " ".join(schema.find("text/pron").text.split())
        after = " ".join(schema.find("text/txt2").text.split())
        options = [" ".join(a.text.split()) for a in schema.findall("answers/answer")]
        gold = "AB".index(schema.find("correctAnswer").text.strip().rstrip(".").strip())
        sentence_start = before.endswith(".")
        normalised = []
        for option in options:
            if pronoun.lower() in ("my", "his", "her", "our", "their"):
                option += "'s"
            first = option.split()[0]
            if not sentence_start and first in _UPPER_PRONOUNS:
                option = first.lower() + option[len(first) :]
            normalised.append(option)
        docs.append({"contexts": [f"{before} {option}" for option in normalised], "continuation": after, "gold": gold})
    return docs


def _subject_title(subject: str) -> str:
    return subject.replace("_", " ")


def mmlu(data_dir: str | Path, split: str = "test", per_subject: int | None = None, shots: int = 0) -> list[dict]:
    """MMLU (57 subjects, 14042 test questions): headerless CSV ``question,A,B,C,D,answer``.

    ``per_subject``: keep the first this-many questions of each subject (a fixed, subject-stratified
    subset, e.g. 18 → 1026 questions); ``None``: all. Prompt as lm-eval's ``mmlu``: a subject description, then
    ``shots`` solved examples — the subject's first ``shots`` dev questions, as lm-eval's ``first_n`` sampler takes
    them (the field's 5-shot MMLU, Hendrycks et al. 2021, §3), each ``question, options, Answer: <letter>`` and a
    blank line — then the question, lettered options, ``Answer:``; the choices are the letters.
    """
    folder = Path(data_dir).expanduser() / "mmlu" / split
    files = sorted(folder.glob(f"*_{split}.csv"))
    if not files:
        raise FileNotFoundError(
            f"no MMLU files {folder}/*_{split}.csv: point data_dir (or $LIT_DOF_DATA) at a folder in the task data "
            "layout (docs/usage.md, 'Task data layout': mmlu/{dev,val,test}/<subject>_<split>.csv)"
        )
    docs = []
    for path in files:
        subject = path.name[: -len(f"_{split}.csv")]
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        solved = "".join(f"{_mmlu_question(row)} {row[5].strip()}\n\n" for row in _mmlu_shots(folder, subject, shots))
        for row in rows[:per_subject] if per_subject else rows:
            answer = row[5].strip()
            prompt = (
                f"The following are multiple choice questions (with answers) about {_subject_title(subject)}.\n\n"
                + solved
                + _mmlu_question(row)
            )
            docs.append(
                {"query": prompt, "choices": ["A", "B", "C", "D"], "gold": "ABCD".index(answer), "subject": subject}
            )
    return docs


def _mmlu_question(row: list[str]) -> str:
    """One MMLU question as lm-eval prompts it: the question, the lettered options, ``Answer:``."""
    return f"{row[0].strip()}\n" + "".join(f"{letter}. {o}\n" for letter, o in zip("ABCD", row[1:5])) + "Answer:"


def _mmlu_shots(folder: Path, subject: str, shots: int) -> list[list[str]]:
    """The first ``shots`` dev questions of ``subject`` (``<folder>/../dev/<subject>_dev.csv``)."""
    if shots <= 0:
        return []
    path = _file(folder.parent.parent, f"mmlu/dev/{subject}_dev.csv")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if len(rows) < shots:
        raise ValueError(f"MMLU {subject}: {shots} shots asked for, {path} holds {len(rows)} questions")
    return rows[:shots]


def mmlu_5shot(data_dir: str | Path, per_subject: int | None = None) -> list[dict]:
    """MMLU test with 5 solved dev questions of the same subject before each (:func:`mmlu` with ``shots=5``): the
    field's standard, and prompts of several hundred tokens — past a student's exact window."""
    return mmlu(data_dir, "test", per_subject, shots=5)


def request_texts(doc: dict) -> list[str]:
    """The texts lm-eval scores for one record, one per choice: ``query + " " + choice`` (choice tasks) or
    ``context + " " + continuation`` (partial tasks; lm-eval's target delimiter is one space).

    Args:
        doc: a record of any task reader.

    Returns:
        the texts.
    """
    if "choices" in doc:
        return [f"{doc['query']} {choice}" for choice in doc["choices"]]
    return [f"{context} {doc['continuation']}" for context in doc["contexts"]]


EXTRA_TASKS = ("mmlu_5shot",)
"""Tasks beyond the paper's seven (not in its average): 5-shot MMLU."""


def load_task(name: str, data_dir: str | Path, **options) -> list[dict]:
    """Records of one of :data:`TASKS` or :data:`EXTRA_TASKS` (``options`` go to the reader, e.g. ``per_subject`` for
    MMLU).

    Raises:
        ValueError: an unknown task name (lists the known ones); FileNotFoundError: a missing file.
    """
    readers = {
        "piqa": piqa,
        "logiqa": logiqa,
        "arc_easy": arc_easy,
        "arc_challenge": arc_challenge,
        "winogrande": winogrande,
        "wsc273": wsc273,
        "mmlu": mmlu,
        "mmlu_5shot": mmlu_5shot,
    }
    if name not in readers:
        raise ValueError(f"unknown task {name!r}; known: {', '.join((*TASKS, *EXTRA_TASKS))}")
    return readers[name](data_dir, **options)


TASK_FILES = {
    "piqa": ("piqa/valid.jsonl", "piqa/valid-labels.lst"),
    "logiqa": ("logiqa/Test.txt",),
    "arc_easy": ("arc/ARC-Easy-Test.jsonl",),
    "arc_challenge": ("arc/ARC-Challenge-Test.jsonl",),
    "winogrande": ("winogrande/dev.jsonl",),
    "wsc273": ("wsc273/WSCollection.xml",),
    "mmlu": ("mmlu/test/*_test.csv",),
    "mmlu_5shot": ("mmlu/test/*_test.csv", "mmlu/dev/*_dev.csv"),
}
"""The files (glob patterns under the data directory) that :func:`load_task` reads for each task of :data:`TASKS`
and :data:`EXTRA_TASKS`."""

DATA_FIX = "point data_dir (or $LIT_DOF_DATA) at a folder in the task data layout (docs/usage.md, 'Task data layout')"
"""How to give the task data, as :func:`check_task_data` says it by default (a command names its own options)."""


class TaskDataError(CommandError, FileNotFoundError):
    """Tasks whose data files are missing (or no data directory at all)."""


def check_task_data(tasks: Iterable[str], data_dir: str | os.PathLike | None, fix: str = DATA_FIX) -> None:
    """Check, before anything loads, that the data of every file-backed task in ``tasks`` is there (tasks without
    files, such as the generated retrieval tasks, pass).

    Args:
        tasks: task names.
        data_dir: the data directory; ``None``: ``$LIT_DOF_DATA``.
        fix: how to give the data, appended to the message.

    Raises:
        TaskDataError: no data directory, or one without some task's files (all of them named, with what is missing).
    """
    needed = [task for task in dict.fromkeys(tasks) if task in TASK_FILES]
    if not needed:
        return
    folder = data_dir or os.environ.get("LIT_DOF_DATA")
    if not folder:
        raise TaskDataError(f"task(s) {', '.join(needed)} need task data and no data directory is set: {fix}")
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise TaskDataError(f"task(s) {', '.join(needed)} need task data and {root} is not a directory: {fix}")
    missing = {task: [pattern for pattern in TASK_FILES[task] if not any(root.glob(pattern))] for task in needed}
    missing = {task: patterns for task, patterns in missing.items() if patterns}
    if missing:
        files = sorted({pattern for patterns in missing.values() for pattern in patterns})
        raise TaskDataError(f"no data for task(s) {', '.join(missing)} in {root} (missing {', '.join(files)}): {fix}")
