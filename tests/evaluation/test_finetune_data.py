"""The fine-tuning data: a task's training and evaluation splits, limited, batched with every option."""

from __future__ import annotations

import pytest

from lit_dof.evaluation.finetune_data import MultipleChoiceDataModule
from tests.conftest import REPO, TINYSTORIES

DATA = REPO.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


def test_splits_are_limited_and_batched_with_every_option():
    data = MultipleChoiceDataModule(
        "arc_easy", str(DATA), tokenizer=str(TINYSTORIES), batch_size=2, seq_len=64, train_limit=4, eval_limit=3
    )
    data.setup("fit")
    assert len(data.train_docs) == 4 and len(data.eval_docs) == 3
    batches = list(data.val_dataloader())
    assert [len(b["gold"]) for b in batches] == [2, 1]
    options = [len(d["choices"]) for d in data.eval_docs]
    assert [len(b["doc_index"]) for b in batches] == [options[0] + options[1], options[2]]
    assert all(b["input_ids"].shape[1] <= 64 for b in batches)
    assert sum(len(b["gold"]) for b in data.train_dataloader()) == 4


def test_no_data_directory_names_the_environment_variable(monkeypatch):
    monkeypatch.delenv("LIT_DOF_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="LIT_DOF_DATA"):
        MultipleChoiceDataModule("arc_easy", None, tokenizer=str(TINYSTORIES)).setup("fit")
