"""Hub streams (``datasets``, ``streaming=True``) split by node and by worker: the documents each (rank, worker)
reads against the set computed directly from the files; held out by content hash whatever the layout; resume.

The "hub" is a local multi-file JSON stream (``datasets.load_dataset("json", data_files=…, streaming=True)``),
one shard per file, like the parquet files of ``wikimedia/wikipedia``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

import lit_dof.data.datamodule as datamodule
from lit_dof.data.datamodule import PackedBlocks
from lit_dof.data.sources import HubDocuments, is_heldout_by_content

DOCS, VAL_EVERY = 61, 4


class _Tokenizer:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w) for w in text.split()]}


def _text(i: int) -> str:  # 7 tokens + EOS: one block of 8 per document, its first token 1000·i + 1
    return " ".join(str(1000 * i + j) for j in range(1, 8))


def _reference_heldout(with_id: bool) -> set[int]:
    """The held-out documents computed from the files alone: blake2b of the id (else the text) ≡ 0 mod 4."""
    keys = {i: f"doc-{i}" if with_id else _text(i) for i in range(DOCS)}
    digest = {i: int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "big") for i, k in keys.items()}
    return {i for i in range(DOCS) if digest[i] % VAL_EVERY == 0}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """``hub(files, with_id)``: a HubDocuments whose ``load_dataset`` streams ``files`` local JSON files, and the
    file each document is in."""
    import datasets

    real = datasets.load_dataset

    def make(files: int, with_id: bool = True):
        paths, file_of = [], {}
        bounds = [round(f * DOCS / files) for f in range(files + 1)]
        for f in range(files):
            path = tmp_path / f"{files}-{with_id}-part{f}.jsonl"
            ids = range(bounds[f], bounds[f + 1])
            rows = [{"text": _text(i), **({"id": f"doc-{i}"} if with_id else {})} for i in ids]
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            paths.append(str(path))
            file_of.update({i: f for i in ids})
        monkeypatch.setattr(
            datasets,
            "load_dataset",
            lambda name, config, split, streaming: real("json", data_files=paths, split=split, streaming=streaming),
        )
        return HubDocuments("wikimedia/wikipedia", "20231101.en"), file_of

    return make


def _docs(data, workers: int) -> list[int]:
    if workers == 0:
        return [b["input_ids"][0].item() // 1000 for b in data]
    loader = DataLoader(data, batch_size=1, num_workers=workers)
    return [row[0] // 1000 for batch in loader for row in batch["input_ids"].tolist()]


@pytest.mark.parametrize("files", [1, 4, 6])  # node split by files or by example, worker split by files or not
def test_ranks_and_workers_cover_the_training_documents_once_and_hold_out_the_same_ones(hub, files):
    source, _ = hub(files)
    heldout = _reference_heldout(with_id=True)
    assert 0 < len(heldout) < DOCS // 2
    training = sorted(set(range(DOCS)) - heldout)
    for world, workers in itertools.product((1, 2, 3), (0, 2)):
        shares = [_docs(PackedBlocks(source, _Tokenizer(), 8, "train", VAL_EVERY, rank=r, world_size=world), workers)
                  for r in range(world)]  # fmt: skip  # packed args
        assert sorted(d for share in shares for d in share) == training, (world, workers)  # once each, none held out
        assert all(shares), (world, workers)  # every rank has documents
        union = []  # the held-out side of the same split: the same documents whatever the layout
        for rank, role in itertools.product(range(world), range(max(workers, 1))):
            kwargs = dict(rank=rank, world=world, role=role, workers=max(workers, 1))
            union += [int(d.split()[0]) // 1000 for d in source.select("validation", VAL_EVERY, **kwargs)]
        assert sorted(union) == sorted(heldout), (world, workers)
    validation = PackedBlocks(source, _Tokenizer(), 8, "val", VAL_EVERY, rank=1, world_size=2)  # all ranks: all of it
    assert _docs(validation, 0) == sorted(heldout)


def test_without_an_id_field_the_text_decides(hub):
    source, _ = hub(3, with_id=False)
    heldout = _reference_heldout(with_id=False)
    assert heldout != _reference_heldout(with_id=True)
    assert _docs(PackedBlocks(source, _Tokenizer(), 8, "val", VAL_EVERY), 0) == sorted(heldout)


@pytest.mark.parametrize(
    ("files", "world", "node_files", "worker_files"),
    [(4, 2, 2, 1), (6, 3, 2, 1), (6, 2, 3, None), (5, 2, None, 3), (1, 2, None, None)],
)
def test_each_node_and_worker_reads_only_its_files(hub, monkeypatch, files, world, node_files, worker_files):
    """When the world size divides the file count, each rank reads ``files / world`` files of its own; when the
    worker split is by files (here 2 workers), each worker reads its own files (``None``: every rank, or worker
    of a rank, reads all the files of its level, and takes every other example)."""
    source, file_of = hub(files)

    def read(rank, worker):
        class Info:
            num_workers, id = 2, worker

        monkeypatch.setattr(datamodule, "get_worker_info", lambda: Info)
        data = PackedBlocks(source, _Tokenizer(), 8, "train", VAL_EVERY, rank=rank, world_size=world)
        return {file_of[d] for d in _docs(data, 0)}

    read_by = {(r, w): read(r, w) for r in range(world) for w in range(2)}
    by_rank = [read_by[r, 0] | read_by[r, 1] for r in range(world)]
    if node_files is None:
        assert all(len(f) == files for f in by_rank)
    else:
        assert [len(f) for f in by_rank] == [node_files] * world and len(set().union(*by_rank)) == files
    for r in range(world):
        if worker_files is None:
            assert read_by[r, 0] == read_by[r, 1] == by_rank[r]
        else:
            assert not read_by[r, 0] & read_by[r, 1] and {len(read_by[r, w]) for w in range(2)} <= {
                worker_files - 1,
                worker_files,
            }


def test_is_heldout_by_content_is_the_blake2b_rule():
    assert is_heldout_by_content("doc-0", 1)
    keys = [f"doc-{i}" for i in range(2000)]
    share = sum(is_heldout_by_content(k, 10) for k in keys) / len(keys)
    assert 0.07 < share < 0.13  # about one in val_every


@pytest.mark.parametrize("files", [4, 1])  # worker split by files, by round robin
def test_resume_with_two_workers_continues_the_interrupted_stream(hub, files):
    """Rank 1 of 2, 2 workers, 2 blocks a batch: resumed after 3 batches, the loader yields exactly the
    uninterrupted one's 4th batch onwards."""
    source, _ = hub(files)
    kwargs = dict(documents=source, tokenizer=_Tokenizer(), seq_len=8, split="train", val_every=VAL_EVERY, rank=1,
                  world_size=2, batch_size=2)  # fmt: skip  # packed args
    full = list(DataLoader(PackedBlocks(**kwargs), batch_size=2, num_workers=2))
    resumed = list(DataLoader(PackedBlocks(**kwargs, skip_batches=3), batch_size=2, num_workers=2))
    assert len(full) >= 8
    for a, b in itertools.zip_longest(full[3:], resumed):
        assert torch.equal(a["input_ids"], b["input_ids"])


def test_the_data_module_streams_the_hub_without_a_local_corpus(hub, monkeypatch):
    """No path and no $LIT_DOF_CORPUS: the module reads the hub stream; its validation blocks are the first
    held-out documents, split across ranks; its training blocks are the rank's share."""
    from lit_dof.data.datamodule import WikipediaDataModule

    hub(4)
    monkeypatch.delenv("LIT_DOF_CORPUS", raising=False)
    module = WikipediaDataModule(path=None, seq_len=8, batch_size=1, val_every=VAL_EVERY, val_blocks=4)
    module.tokenizer = _Tokenizer()
    monkeypatch.setattr(WikipediaDataModule, "_rank", lambda self: (1, 2))
    val = [b["input_ids"][0, 0].item() // 1000 for b in module.val_dataloader()]
    assert val == sorted(_reference_heldout(with_id=True))[:4][1::2]
    train = [b["input_ids"][0, 0].item() // 1000 for b in module.train_dataloader()]
    assert train and not set(train) & _reference_heldout(with_id=True)


def test_a_hub_stream_that_cannot_load_names_the_dataset_and_the_local_fix(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        RuntimeError,
        match=r"wikimedia/wikipedia \(20231101.en\) cannot be streamed.*: offline\. "
        r"Point --data.init_args.path \(or LIT_DOF_CORPUS\) at a local corpus file",
    ):
        next(HubDocuments("wikimedia/wikipedia", "20231101.en").select("train", 4, rank=0, world=1, role=0, workers=1))


def _no_corpus_module(monkeypatch):
    """A data module without a local corpus whose tokenizer must not load (the check comes first)."""
    from lit_dof.data.datamodule import WikipediaDataModule

    monkeypatch.delenv("LIT_DOF_CORPUS", raising=False)
    monkeypatch.setattr("lit_dof.teacher.loading.load_tokenizer", lambda name: pytest.fail("the tokenizer loaded"))
    return WikipediaDataModule(path=None)


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_without_a_local_corpus_fails_at_setup_without_asking_the_hub(monkeypatch, variable):
    import huggingface_hub

    from lit_dof.data.sources import CorpusUnavailableError

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda *a, **k: pytest.fail("the hub was asked"))
    with pytest.raises(CorpusUnavailableError, match=r"^no corpus: .*offline mode is on .*--data.init_args.path"):
        _no_corpus_module(monkeypatch).setup("fit")


def test_an_unreachable_hub_fails_at_setup_after_one_request(monkeypatch):
    import huggingface_hub

    from lit_dof.data.sources import CorpusUnavailableError

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    asked = []

    def unreachable(self, repo_id, timeout=None):
        asked.append((repo_id, timeout))
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", unreachable)
    with pytest.raises(CorpusUnavailableError, match=r"the hub is unreachable \(ConnectionError: Name or service"):
        _no_corpus_module(monkeypatch).setup("fit")
    assert asked == [("wikimedia/wikipedia", 5.0)]


def test_a_hub_that_answers_passes_the_check(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)

    def gated(self, repo_id, timeout=None):  # an answer, even an error status: datasets reports it at the read
        raise HfHubHTTPError("401 Client Error", response=SimpleNamespace(headers={}, request=None))

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", gated)
    HubDocuments("wikimedia/wikipedia", "20231101.en").check_reachable()
