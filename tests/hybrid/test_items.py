"""Search, confirmation and held-out items of a task: disjoint, seeded, from the validation split."""

from __future__ import annotations

import pytest

from lit_dof.evaluation import task_data
from lit_dof.hybrid.items import task_items
from tests.conftest import REPO

DATA = REPO.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


@needs_data
def test_task_items_are_disjoint_seeded_and_use_validation_splits():
    items = lambda docs: {(d["query"], tuple(d["choices"]), d["gold"]) for d in docs}  # noqa: E731
    search, confirm, heldout, where = task_items("arc_easy", DATA, 20, 30, seed=1, confirm_items=25)
    assert len(search) == 20 and len(confirm) == 25 and len(heldout) == 30 and "validation split" in where
    dev = items(task_data.arc(DATA, "Easy", "Dev"))
    assert items(search) <= dev and items(confirm) <= dev and items(search).isdisjoint(items(confirm))
    assert items(heldout) <= items(task_data.arc(DATA, "Easy", "Test"))
    again = task_items("arc_easy", DATA, 20, 30, seed=1)  # the confirmation set does not move the others
    assert again[0] == search and again[2] == heldout and again[1] == []
    search, confirm, heldout, where = task_items("piqa", DATA, 50, 60, confirm_items=10)  # PIQA repeats goals
    assert "permutation" in where and len(items(search)) == 50 and items(search).isdisjoint(items(heldout))
    assert items(confirm).isdisjoint(items(search) | items(heldout))
    with pytest.raises(ValueError, match="unknown task"):
        task_items("hellaswag", DATA, 1, 1)
