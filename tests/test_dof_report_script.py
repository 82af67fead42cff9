"""scripts/dof_report.py reads its λ rules as arithmetic on numbers (never ``eval``) and needs a corpus named by
``--corpus`` or ``$LIT_DOF_CORPUS`` (no default path): both checked before any teacher is loaded."""

from __future__ import annotations

import pytest

from tests.conftest import load_script

SCRIPT = load_script("dof_report")


@pytest.mark.parametrize(
    ("text", "value"),
    [("2**64", 2.0**64), ("2^-4", 2.0**-4), ("1e-3", 1e-3), ("-0.5*2**10", -512.0), ("3", 3.0), ("(1+1)**3/4", 2.0)],
)
def test_lam_values_are_arithmetic_on_numbers(text, value):
    assert SCRIPT.parse_number(text) == value


@pytest.mark.parametrize("text", ["__import__('os')", "x", "2**64 if 1 else 0", "'2'", "len([1])", "2**99999", ""])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        SCRIPT.parse_number(text)


def test_lam_rules():
    assert SCRIPT.parse_lam("auto") == (None, "auto")
    assert SCRIPT.parse_lam("2**64") == (None, 2.0**64)
    assert SCRIPT.parse_lam("trace:2**-8") == ("trace", 2.0**-8)
    assert SCRIPT.parse_lam("max_eigenvalue:0.0625") == ("max_eigenvalue", 0.0625)


def test_no_corpus_is_a_usage_error_naming_both_ways(monkeypatch, capsys):
    monkeypatch.delenv("LIT_DOF_CORPUS", raising=False)
    with pytest.raises(SystemExit) as exit_:
        SCRIPT.main([])
    assert exit_.value.code == 2
    assert "--corpus FILE or set LIT_DOF_CORPUS" in capsys.readouterr().err


def test_missing_corpus_file_and_bad_lam_are_usage_errors(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LIT_DOF_CORPUS", str(tmp_path / "absent.txt.gz"))
    with pytest.raises(SystemExit):
        SCRIPT.main([])
    assert "absent.txt.gz: no such file" in capsys.readouterr().err
    corpus = tmp_path / "c.txt"
    corpus.write_text("text\n")
    with pytest.raises(SystemExit):
        SCRIPT.main(["--corpus", str(corpus), "--lam", "auto", "open('x')"])
    assert "--lam: not a number" in capsys.readouterr().err
