"""The training stream's document order: a seeded buffer shuffle that differs by seed, replays exactly (so a
resumed run continues the same order, workers included) and keeps every document once."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from lit_dof.data.datamodule import PackedBlocks, WikipediaDataModule
from lit_dof.data.order import buffer_shuffle
from tests.data.test_datamodule import _documents, _Tokenizer


def test_buffer_shuffle_is_a_seeded_permutation():
    items = list(range(200))
    first = list(buffer_shuffle(items, 16, "1"))
    assert sorted(first) == items and first != items
    assert list(buffer_shuffle(items, 16, "1")) == first and list(buffer_shuffle(items, 16, "2")) != first
    assert list(buffer_shuffle(items, 1, "1")) == items  # a buffer of one keeps the order
    # an item moves at most buffer places earlier
    assert all(position >= item - 16 for position, item in enumerate(first))
    # with the whole stream in the buffer every order is reachable: each item opens the stream about equally often
    openers = Counter(next(iter(buffer_shuffle(range(5), 5, str(s)))) for s in range(2000))
    assert set(openers) == set(range(5)) and min(openers.values()) > 300
    with pytest.raises(ValueError, match="shuffle buffer"):
        list(buffer_shuffle(items, 0, "1"))


def test_a_shuffled_stream_covers_the_same_documents_and_resumes_in_the_same_order():
    kwargs = dict(documents=_documents, tokenizer=_Tokenizer(), seq_len=8, split="train", val_every=10, batch_size=2)
    plain = list(DataLoader(PackedBlocks(**kwargs), batch_size=2, num_workers=2))
    shuffled = list(DataLoader(PackedBlocks(**kwargs, shuffle_seed=3, shuffle_buffer=8), batch_size=2, num_workers=2))
    other = list(DataLoader(PackedBlocks(**kwargs, shuffle_seed=4, shuffle_buffer=8), batch_size=2, num_workers=2))

    def rows(batches):
        return [tuple(row.tolist()) for b in batches for row in b["input_ids"]]

    assert sorted(rows(shuffled)) == sorted(rows(plain)) and rows(shuffled) != rows(plain) != rows(other)
    resumed = PackedBlocks(**kwargs, shuffle_seed=3, shuffle_buffer=8, skip_batches=5)
    for a, b in itertools.zip_longest(shuffled[5:], DataLoader(resumed, batch_size=2, num_workers=2)):
        assert torch.equal(a["input_ids"], b["input_ids"])


def test_the_data_module_refuses_a_bad_shuffle_and_records_its_seed():
    with pytest.raises(ValueError, match="shuffle_buffer=0 is invalid"):
        WikipediaDataModule(shuffle_seed=1, shuffle_buffer=0)
    with pytest.raises(ValueError, match="shuffle_seed=-1 is invalid"):
        WikipediaDataModule(shuffle_seed=-1)
    assert WikipediaDataModule(shuffle_seed=2).hparams["shuffle_seed"] == 2  # a resumed run must repeat it
