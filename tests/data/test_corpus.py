"""Local corpus reading: every supported format, lazily, with the real WikiExtractor file."""

import gzip
import itertools
import json

import pytest

from lit_dof.data.corpus import iter_documents
from tests.conftest import WIKIPEDIA


def test_formats(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nline two\n\n\nsecond doc\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("only doc\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "j1"}) + "\n\n" + json.dumps({"text": "j2"}) + "\n")
    (tmp_path / "d.txt").write_text('<doc id="1" title="T">\nT\n\nBody one.\n</doc>\n<doc id="2" title="E">\nE\n</doc>\n')
    assert list(iter_documents(tmp_path / "a.txt")) == ["first doc\nline two", "second doc"]
    assert list(iter_documents(tmp_path / "b.txt.gz")) == ["only doc"]
    assert list(iter_documents(tmp_path / "c.jsonl")) == ["j1", "j2"]
    assert list(iter_documents(tmp_path / "d.txt")) == ["Body one."]  # title line dropped, empty doc skipped


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        next(iter_documents(tmp_path / "nope.txt"))


def test_real_wikiextractor_file_streams():
    docs = list(itertools.islice(iter_documents(WIKIPEDIA), 50))
    assert len(docs) == 50 and all("<doc" not in d and "</doc>" not in d for d in docs)
    assert docs[0].startswith("Jarred Shaw (born")  # the first document (a bare title) is empty
