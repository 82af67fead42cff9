"""The corpus splits (lit_dof.data.splits): training, validation, test and long-document test are disjoint and
deterministic, the same documents for a local file and a hub stream of the same documents and for every rank and
worker, of the documented sizes on the local corpus; training never yields a test or long-document token."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest
from transformers import AutoTokenizer

from lit_dof.data.corpus import check_corpus, is_heldout, iter_documents
from lit_dof.data.datamodule import PackedBlocks
from lit_dof.data.sources import (
    HubDocuments,
    LocalDocuments,
    is_heldout_by_content,
    last_long_documents,
    split_documents,
)
from lit_dof.data.splits import (
    LONG_DOCUMENT_CHARS,
    SPLITS,
    check_record_split,
    document_split,
    is_long_document,
    is_test_document,
    split_rule,
)
from tests.conftest import TINYSTORIES, WIKIPEDIA

LOCAL_SIZES = {"train": 35405, "validation": 362, "test": 334, "long": 82}  # as lit_dof.data.splits documents


def _texts(count: int = 600) -> list[str]:
    """Short documents and, every 25th, one of ≥ LONG_DOCUMENT_CHARS characters (unique texts)."""
    filler = " ".join(f"w{j}" for j in range(LONG_DOCUMENT_CHARS // 4))
    return [f"doc {i} " + (filler if i % 25 == 7 else f"short text {i}") for i in range(count)]


def _by_rule(texts: list[str], validation: set[int]) -> dict[str, list[str]]:
    """Each split's documents computed from the rules alone (blake2b with the splits' personalisation)."""
    out: dict[str, list[str]] = {split: [] for split in SPLITS}
    for i, text in enumerate(texts):
        digest = lambda person, text=text: int.from_bytes(  # noqa: E731
            hashlib.blake2b(text.encode(), digest_size=8, person=person).digest(), "big"
        )
        if i in validation:
            out["validation"].append(text)
        elif len(text) >= LONG_DOCUMENT_CHARS and digest(b"lit-dof long") % 2 == 0:
            out["long"].append(text)
        elif digest(b"lit-dof test") % 100 == 0:
            out["test"].append(text)
        else:
            out["train"].append(text)
    return out


def _layouts(source, split: str, val_every: int) -> list[list[str]]:
    """The split as every (rank, worker) of 1 × 1, 2 × 2 and 3 × 2 reads it, each layout's shares joined."""
    found = []
    for world, workers in ((1, 1), (2, 2), (3, 2)):
        shares = [list(source.select(split, val_every, rank=r, world=world, role=w, workers=workers))
                  for r in range(world) for w in range(workers)]  # fmt: skip  # packed comprehension
        found.append(sorted(doc for share in shares for doc in share))
    return found


def test_the_rules_are_the_documented_hashes_and_refuse_unknown_names():
    texts = _texts()
    by_function = {split: [t for t in texts if document_split(t, False) == split] for split in SPLITS}
    assert _by_rule(texts, set()) == by_function
    assert all(document_split(t, True) == "validation" for t in texts)  # validation comes first
    assert not is_long_document("x" * (LONG_DOCUMENT_CHARS - 1))
    share = sum(is_test_document(f"document {i}") for i in range(20000)) / 20000
    assert 0.008 < share < 0.012  # about one in 100, as validation
    with pytest.raises(ValueError, match="unknown split 'heldout': use one of train, validation, test, long"):
        split_rule("heldout")
    with pytest.raises(ValueError, match="unknown split True"):
        next(LocalDocuments(lambda: iter(texts)).select(True, 100, rank=0, world=1, role=0, workers=1))
    assert "person=b'lit-dof test') % 100 == 0" in split_rule("test")
    assert check_record_split({"split": "test"}, "test", "ppl.json") == {"split": "test"}
    with pytest.raises(ValueError, match="ppl.json measured the validation split, not the test split: pass --ppl"):
        check_record_split({"ppl": 3.0}, "test", "ppl.json")  # a record before the test split: validation


def test_a_local_file_and_a_hub_stream_of_the_same_documents_agree_on_every_layout(tmp_path, monkeypatch):
    """The same documents as a local .jsonl file (validation by index) and as a 3-file hub stream with ids
    (validation by hash of the id): the test and long splits are the same rule-chosen documents less each source's
    own validation documents, whatever the ranks and workers; the four splits are disjoint and cover the corpus."""
    import datasets

    texts, val_every = _texts(), 8
    (tmp_path / "local.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    paths = []
    for f in range(3):
        paths.append(str(tmp_path / f"part{f}.jsonl"))
        rows = [{"id": str(i), "text": t} for i, t in enumerate(texts) if i % 3 == f]
        (tmp_path / f"part{f}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split, streaming: real(
        "json", data_files=paths, split=split, streaming=streaming))  # fmt: skip  # packed lambda
    local = LocalDocuments(lambda: iter_documents(tmp_path / "local.jsonl"))
    hub = HubDocuments("wikimedia/wikipedia", "20231101.en")
    expected = {
        "local": _by_rule(texts, {i for i in range(len(texts)) if i % val_every == 0}),
        "hub": _by_rule(texts, {i for i in range(len(texts)) if is_heldout_by_content(str(i), val_every)}),
    }
    candidates = {s: {t for t in _by_rule(texts, set())[s]} for s in ("test", "long")}
    assert all(len(candidates[s]) >= 3 for s in candidates)  # the check below has documents to compare
    for name, source in (("local", local), ("hub", hub)):
        for split in SPLITS:
            layouts = _layouts(source, split, val_every)
            assert all(found == sorted(expected[name][split]) for found in layouts), (name, split)
        assert sorted(itertools.chain(*expected[name].values())) == sorted(texts)  # disjoint, covering
        for split in ("test", "long"):  # the rule-chosen documents, less this source's validation ones
            validation = set(expected[name]["validation"])
            assert set(expected[name][split]) == candidates[split] - validation
    assert list(split_documents(tmp_path / "local.jsonl", "test", val_every)) == expected["local"]["test"]
    assert list(split_documents(hub, "long", val_every)) != []


def test_the_local_corpus_splits_are_disjoint_and_of_the_documented_sizes():
    """One pass classifies every document; each split read through the data module's source (as evaluation reads
    it) is exactly its documents, and the sizes are the module docstring's."""
    kinds = [document_split(doc, is_heldout(i, 100)) for i, doc in enumerate(iter_documents(WIKIPEDIA))]
    assert {split: kinds.count(split) for split in SPLITS} == LOCAL_SIZES
    for split in ("test", "long"):
        texts = list(split_documents(WIKIPEDIA, split))
        assert len(texts) == LOCAL_SIZES[split]
        assert all(len(t) >= LONG_DOCUMENT_CHARS for t in texts) == (split == "long")
    assert kinds[0] == "validation" and kinds[103] == "test" and kinds[594] == "long"  # the first of each


def test_training_never_yields_a_test_or_long_document_token():
    """The real corpus with the TinyStories tokenizer: the training stream, past the first test document (103)
    and the first long one (594), is exactly the training documents' tokens (EOS after each) — those two are
    skipped — and every rank × worker share of a 2 × 2 layout holds only training documents."""
    tokenizer = AutoTokenizer.from_pretrained(TINYSTORIES)
    docs = list(itertools.islice(iter_documents(WIKIPEDIA), 600))
    expected = []
    for i, doc in enumerate(docs):
        if document_split(doc, is_heldout(i, 100)) == "train":
            expected += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    blocks = len(expected) // 512
    data = PackedBlocks(lambda: iter_documents(WIKIPEDIA), tokenizer, 512, "train", 100, max_blocks=blocks)
    stream = [t for block in data for t in block["input_ids"].tolist()]
    assert stream == expected[: blocks * 512] and blocks * 512 > len(expected) - 3000  # past document 594
    heldout = [docs[103], docs[594]]
    assert document_split(heldout[0], False) == "test" and document_split(heldout[1], False) == "long"
    source = LocalDocuments(lambda: itertools.islice(iter_documents(WIKIPEDIA), 600))
    shares = [set(source.select("train", 100, rank=r, world=2, role=w, workers=2)) for r in range(2) for w in range(2)]
    assert set().union(*shares) == {d for i, d in enumerate(docs) if document_split(d, is_heldout(i, 100)) == "train"}
    assert not set().union(*shares) & set(heldout)


class _WordTokenizer:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] * len(text.split())}


def test_check_corpus_counts_test_and_long_documents_as_neither(tmp_path):
    texts = _texts()
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    split = {i: document_split(t, is_heldout(i, 8)) for i, t in enumerate(texts)}
    assert {"test", "long"} <= set(split.values())
    train = sum(len(t.split()) + 1 for i, t in enumerate(texts) if split[i] == "train")  # one EOS each
    with pytest.raises(ValueError, match=f"600 documents give {train} training tokens"):
        check_corpus(tmp_path / "c.jsonl", _WordTokenizer(), seq_len=1, val_every=8, train_blocks=10**9, val_blocks=1)


def test_split_sizes_counts_every_split(tmp_path):
    """scripts/split_sizes.py (the sizes the docs quote): documents, characters and tokens per split."""
    from tests.conftest import load_script

    texts = _texts()
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    script = load_script("split_sizes")
    sizes = script.split_sizes(str(tmp_path / "c.jsonl"), _WordTokenizer(), val_every=8, long_limit=1000)
    kinds = [document_split(t, is_heldout(i, 8)) for i, t in enumerate(texts)]
    for split in SPLITS:
        mine = [t for t, kind in zip(texts, kinds) if kind == split]
        assert sizes[split]["documents"] == len(mine) and sizes[split]["characters"] == sum(map(len, mine))
        assert sizes[split]["tokens"] == sum(len(t.split()) for t in mine)
    long = [len(t.split()) for t, kind in zip(texts, kinds) if kind == "long"]
    assert sizes["long"]["at_least_4096"] == sum(n >= 4096 for n in long) == len(long)
    assert sizes["long"]["scored_tokens"] == 1000 * len(long)
    out = tmp_path / "s.json"
    record = script.main(["--corpus", str(tmp_path / "c.jsonl"), "--val_every", "8", "--output", str(out)])
    assert json.loads(out.read_text()) == record and "tokens" not in record["splits"]["train"]


def test_the_last_long_training_documents_are_those_the_rules_put_in_training_last(tmp_path):
    """``last_long_documents``: the last long training documents with enough tokens, their indices within the
    training split and its size, from the split rules computed independently (``_by_rule``)."""
    texts = _texts()
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    train = _by_rule(texts, {i for i in range(len(texts)) if is_heldout(i, 100)})["train"]
    long = [(i, t) for i, t in enumerate(train) if len(t) >= LONG_DOCUMENT_CHARS]
    assert len(long) >= 4
    chosen, indices, total = last_long_documents(tmp_path / "c.jsonl", _WordTokenizer(), 3, min_tokens=1000)
    assert (chosen, indices, total) == ([t for _, t in long[-3:]], [i for i, _ in long[-3:]], len(train))
    words = len(long[0][1].split())
    assert last_long_documents(tmp_path / "c.jsonl", _WordTokenizer(), 3, min_tokens=words + 1)[:2] == ([], [])
