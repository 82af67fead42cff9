"""Local corpus reading: every supported format, lazily, with the real WikiExtractor file."""

import gzip
import itertools
import json

import pytest

from lit_dof.data.corpus import is_heldout, iter_documents
from tests.conftest import WIKIPEDIA


def test_formats(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nline two\n\n\nsecond doc\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("only doc\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "j1"}) + "\n\n" + json.dumps({"text": "j2"}) + "\n")
    (tmp_path / "d.txt").write_text(
        '<doc id="1" title="T">\nT\n\nBody one.\n</doc>\n<doc id="2" title="E">\nE\n</doc>\n'
    )
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


class _WordTokenizer:
    """One token per whitespace-separated word, EOS id 0: token counts a test can state exactly."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] * len(text.split())}


def test_check_corpus_counts_until_the_needs_are_met(tmp_path):
    from lit_dof.data.corpus import check_corpus

    docs = [" ".join(["w"] * 9) for _ in range(10)]  # 10 tokens each with EOS; docs 0, 5 held out (val_every 5)
    (tmp_path / "c.txt").write_text("\n\n".join(docs))
    found = check_corpus(tmp_path / "c.txt", _WordTokenizer(), seq_len=10, val_every=5, train_blocks=3, val_blocks=2)
    assert found == {"train_tokens": 30, "val_tokens": 20, "documents": 6}  # stops after document 5
    with pytest.raises(
        ValueError,
        match=r"too short: 10 documents give 80 training tokens and 20 held-out.*"
        r"needs at least 90 training tokens \(9 blocks of 10\)",
    ):
        check_corpus(tmp_path / "c.txt", _WordTokenizer(), seq_len=10, val_every=5, train_blocks=9, val_blocks=2)


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", b"", "has no documents"),
    ("fake.txt.gz", b"plain text, not gzip\n", "not a readable gzip file"),
    ("bad.jsonl", b'{"text": "ok"}\nnot json\n', "a line is not JSON"),
])  # fmt: skip  # parametrize table
def test_check_corpus_names_the_file_and_the_problem(tmp_path, name, content, message):
    from lit_dof.data.corpus import check_corpus

    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        check_corpus(tmp_path / name, _WordTokenizer(), seq_len=4, val_every=100, train_blocks=1, val_blocks=1)
    assert name in str(info.value)


def test_a_fit_on_a_one_line_corpus_stops_before_the_teacher_loads(tmp_path, monkeypatch):
    import lit_dof.teacher.loading as loading
    from lit_dof.pipeline.cli import build_cli
    from tests.pipeline.conftest import fit_args

    (tmp_path / "one.txt").write_text("a single short line\n")
    monkeypatch.setattr(loading, "load_teacher", lambda *a, **k: pytest.fail("the teacher was loaded"))
    with pytest.raises(ValueError, match="one.txt is too short"):
        build_cli(fit_args(tmp_path, steps=1, extra=[f"--data.init_args.path={tmp_path / 'one.txt'}"]))


def test_is_heldout_takes_every_val_every_th_document_from_the_first():
    assert [i for i in range(12) if is_heldout(i, 5)] == [0, 5, 10]
    assert all(is_heldout(i, 1) for i in range(3))
