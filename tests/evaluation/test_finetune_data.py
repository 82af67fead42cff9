"""The fine-tuning data: a task's train, choose and report splits — disjoint, limited, batched with every option."""

from __future__ import annotations

import pytest

from lit_dof.evaluation import task_data
from lit_dof.evaluation.finetune_data import MultipleChoiceDataModule
from lit_dof.evaluation.finetune_splits import PROTOCOL_TASKS, protocol_splits
from tests.conftest import REPO, TINYSTORIES

DATA = REPO.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


def _key(doc: dict) -> str:
    return repr(doc.get("query") or doc["contexts"]) + repr(doc.get("choices") or doc["continuation"])


@pytest.mark.parametrize("task", sorted(PROTOCOL_TASKS))
def test_the_three_splits_are_disjoint_and_nonempty(task):
    splits = protocol_splits(task, DATA, per_subject=2)
    keys = [{_key(d) for d in part} for part in (splits.train, splits.choose, splits.report)]
    assert all(keys), task
    overlap = len(keys[0] & keys[1]) + len(keys[0] & keys[2]) + len(keys[1] & keys[2])
    if task in ("arc_easy", "arc_challenge", "mmlu"):  # the releases' own splits repeat a few questions
        assert overlap <= 0.01 * len(keys[2]), task
    else:  # partitions by index (the module docstring) never share a document
        assert overlap == 0, task


def test_piqa_partition_covers_the_validation_set_once_by_index():
    docs = task_data.piqa(DATA)
    splits = protocol_splits("piqa", DATA)
    assert (len(splits.train), len(splits.choose), len(splits.report)) == (919, 460, 459)
    assert splits.train[1]["query"] == docs[2]["query"]
    assert splits.choose[0]["query"] == docs[1]["query"] and splits.report[0]["query"] == docs[3]["query"]
    with pytest.raises(ValueError, match="WSC273 has no training split"):
        protocol_splits("wsc273", DATA)


def test_splits_are_limited_and_batched_with_every_option():
    data = MultipleChoiceDataModule(
        "arc_easy", str(DATA), tokenizer=str(TINYSTORIES), batch_size=2, seq_len=64, train_limit=4, choose_limit=3,
        report_limit=5,
    )  # fmt: skip
    data.setup("fit")
    assert (len(data.train_docs), len(data.choose_docs), len(data.report_docs)) == (4, 3, 5)
    assert data.choose_docs[0]["query"] == task_data.arc(DATA, "Easy", "Dev")[0]["query"]
    assert data.report_docs[0]["query"] == task_data.arc(DATA, "Easy", "Test")[0]["query"]
    choose, report = (list(loader) for loader in data.val_dataloader())
    assert [len(b["gold"]) for b in choose] == [2, 1] and [len(b["gold"]) for b in report] == [2, 2, 1]
    options = [len(d["choices"]) for d in data.choose_docs]
    assert [len(b["doc_index"]) for b in choose] == [options[0] + options[1], options[2]]
    assert all(b["input_ids"].shape[1] <= 64 for b in choose + report)
    assert sum(len(b["gold"]) for b in data.train_dataloader()) == 4


def test_bad_task_or_limit_is_refused_before_loading(monkeypatch):
    with pytest.raises(ValueError, match="no fine-tuning data for 'wsc273'"):
        MultipleChoiceDataModule("wsc273", str(DATA), tokenizer=str(TINYSTORIES))
    with pytest.raises(ValueError, match="--data.init_args.report_limit"):
        MultipleChoiceDataModule("piqa", str(DATA), tokenizer=str(TINYSTORIES), report_limit=0)
    monkeypatch.delenv("LIT_DOF_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="LIT_DOF_DATA"):
        MultipleChoiceDataModule("arc_easy", None, tokenizer=str(TINYSTORIES)).setup("fit")
