"""The three splits of the per-task fine-tuning protocol (METHOD.md §4): documents to **train** on, documents to
**choose** the epoch and the learning rate on, and documents to **report** — disjoint, so that nothing reported was
chosen on (the paper reports the best epoch of the evaluation set itself; here the choice is made on its own split).

Where a release ships all three, they are used as shipped (ARC: Train / Dev / Test; MMLU: val / dev / test; as
released they share a few questions: ARC-Easy's Test repeats 2 of its Train questions, MMLU's test 13 of its val). The
snapshot lacks the rest (SOURCES.md), so fixed, stated partitions by document index fill in:

* **PIQA** (only the 1838 validation questions): train on the even-indexed questions (919), choose on indices
  1 mod 4 (460), report indices 3 mod 4 (459);
* **WinoGrande** (train ``train_xs``, 160): choose on dev indices 1 mod 4 (317), report the other dev sentences (950);
* **LogiQA** (train on ``Eval.txt``, 651, the dev split): choose on Test indices 1 mod 4 (163), report the other
  Test questions (488).

WSC273 has no training data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lit_dof.evaluation import task_data


@dataclass(frozen=True)
class ProtocolSplits:
    """One task's documents for per-task fine-tuning (records of :mod:`lit_dof.evaluation.task_data`).

    Attributes:
        train: the documents trained on.
        choose: the documents the best epoch (and the teacher's learning rate) is chosen on.
        report: the documents the chosen model's accuracy is reported on; disjoint from both.
    """

    train: list[dict]
    choose: list[dict]
    report: list[dict]


def _partition(docs: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(docs at indices 1 mod 4, the others)``: a choosing split cut from an evaluation set."""
    return docs[1::4], [d for i, d in enumerate(docs) if i % 4 != 1]


def _piqa(data_dir: str | Path, per_subject: int | None) -> ProtocolSplits:
    docs = task_data.piqa(data_dir)
    return ProtocolSplits(train=docs[0::2], choose=docs[1::4], report=docs[3::4])


def _arc(subset: str):
    def read(data_dir: str | Path, per_subject: int | None) -> ProtocolSplits:
        return ProtocolSplits(*(task_data.arc(data_dir, subset, split) for split in ("Train", "Dev", "Test")))

    return read


def _winogrande(data_dir: str | Path, per_subject: int | None) -> ProtocolSplits:
    choose, report = _partition(task_data.winogrande(data_dir, "dev"))
    return ProtocolSplits(task_data.winogrande(data_dir, "train_xs"), choose, report)


def _logiqa(data_dir: str | Path, per_subject: int | None) -> ProtocolSplits:
    choose, report = _partition(task_data.logiqa(data_dir, "Test"))
    return ProtocolSplits(task_data.logiqa(data_dir, "Eval"), choose, report)


def _mmlu(data_dir: str | Path, per_subject: int | None) -> ProtocolSplits:
    return ProtocolSplits(
        train=task_data.mmlu(data_dir, "val"),
        choose=task_data.mmlu(data_dir, "dev"),
        report=task_data.mmlu(data_dir, "test", per_subject),
    )


PROTOCOL_TASKS = {
    "piqa": _piqa,
    "arc_easy": _arc("Easy"),
    "arc_challenge": _arc("Challenge"),
    "winogrande": _winogrande,
    "logiqa": _logiqa,
    "mmlu": _mmlu,
}
"""The tasks with fine-tuning data offline, each with its reader of :class:`ProtocolSplits`."""


def protocol_splits(task: str, data_dir: str | Path, per_subject: int | None = None) -> ProtocolSplits:
    """Train, choose and report documents of ``task`` (the module docstring says which files and indices).

    Args:
        task: one of :data:`PROTOCOL_TASKS`.
        data_dir: folder in the task data layout (docs/usage.md, "Task data layout").
        per_subject: MMLU only: report on the first this-many test questions of each subject (``None``: all).

    Returns:
        the three splits.

    Raises:
        ValueError: a task without fine-tuning data (names the ones with); FileNotFoundError: a missing file.
    """
    check_protocol_task(task)
    return PROTOCOL_TASKS[task](data_dir, per_subject)


def check_protocol_task(task: str) -> None:
    """Refuse a task without fine-tuning data.

    Raises:
        ValueError: ``task`` is not one of :data:`PROTOCOL_TASKS` (names the ones that are).
    """
    if task not in PROTOCOL_TASKS:
        raise ValueError(
            f"no fine-tuning data for {task!r} (WSC273 has no training split); tasks with: {', '.join(PROTOCOL_TASKS)}"
        )
