"""Training and validation blocks across ranks and dataloader workers: disjoint, covering, resumable."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

import lit_dof.data.datamodule as datamodule
from lit_dof.data.datamodule import PackedBlocks, WikipediaDataModule


class _Tokenizer:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w) for w in text.split()]}


def _documents():  # document i holds the tokens 1000·i + 1 … 1000·i + 7 (7 tokens + EOS: one block of 8)
    return iter(" ".join(str(1000 * i + j) for j in range(1, 8)) for i in range(60))


def _blocks(rank, world, worker, workers, **kwargs):
    class Info:
        num_workers, id = workers, worker

    data = PackedBlocks(_documents, _Tokenizer(), 8, "train", 10, rank=rank, world_size=world, **kwargs)
    original = datamodule.get_worker_info
    datamodule.get_worker_info = lambda: Info
    try:
        return [tuple(b["input_ids"].tolist()) for b in data]
    finally:
        datamodule.get_worker_info = original


def test_ranks_and_workers_are_disjoint_and_cover_the_training_documents():
    shards = [_blocks(r, 2, w, 3) for r in range(2) for w in range(3)]
    flat = [b for shard in shards for b in shard]
    assert len(flat) == len(set(flat))  # disjoint
    docs = {b[0] // 1000 for b in flat}
    assert docs == {i for i in range(60) if i % 10}  # every training document, no held-out one
    assert len({len(s) for s in shards}) == 1  # 54 documents over 6 shards: 9 each


def test_resume_with_two_workers_continues_the_uninterrupted_stream():
    """A DataLoader takes batch b from worker b % workers: after 5 batches, skipping what each worker produced
    gives exactly the uninterrupted loader's 6th batch onwards."""
    kwargs = dict(documents=_documents, tokenizer=_Tokenizer(), seq_len=8, split="train", val_every=10)
    full = list(DataLoader(PackedBlocks(**kwargs, batch_size=2), batch_size=2, num_workers=2))
    resumed = list(DataLoader(PackedBlocks(**kwargs, skip_batches=5, batch_size=2), batch_size=2, num_workers=2))
    assert len(full) > 8
    for a, b in itertools.zip_longest(full[5:], resumed):
        assert torch.equal(a["input_ids"], b["input_ids"])


def test_validation_blocks_are_split_across_ranks(monkeypatch, tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(" ".join(str(1000 * i + j) for j in range(1, 8)) for i in range(200)))
    module = WikipediaDataModule(path=str(tmp_path / "c.txt"), seq_len=8, batch_size=1, val_every=10, val_blocks=5)
    module.tokenizer, module._checked = _Tokenizer(), True
    alone = [tuple(b["input_ids"][0].tolist()) for b in module.val_dataloader()]
    shares = []
    for rank in range(2):
        monkeypatch.setattr(WikipediaDataModule, "_rank", lambda self, r=rank: (r, 2))
        shares.append([tuple(b["input_ids"][0].tolist()) for b in module.val_dataloader()])
    assert len(alone) == 5 and len(shares[0]) == len(shares[1]) == 2  # equal shares: the 5th block is dropped
    assert sorted(shares[0] + shares[1]) == sorted(alone[:4]) and not set(shares[0]) & set(shares[1])
    monkeypatch.setattr(WikipediaDataModule, "_rank", lambda self: (0, 8))
    with pytest.raises(ValueError, match="val_blocks=5 is fewer than the 8 ranks"):
        module.val_dataloader()
