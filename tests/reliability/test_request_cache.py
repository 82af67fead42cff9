"""An evaluation's request cache cannot run code: lm-eval unpickles each stored answer unrestricted, so lit-dof
reads every answer first with an unpickler that resolves no global, and refuses a file holding anything else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lit_dof.evaluation.request_cache import UnsafeRequestCacheError, check_cache_files, request_cache
from tests.conftest import DATA, TINYSTORIES
from tests.reliability.payloads import Payload

sqlitedict = pytest.importorskip("sqlitedict")


def _write(path: Path, answers: dict) -> None:
    """A cache file as lm-eval writes it (``SqliteDict`` with its default, pickling codec)."""
    with sqlitedict.SqliteDict(str(path), autocommit=True) as db:
        db.update(answers)


def test_plain_answers_pass_and_a_pickled_object_is_refused_by_name(tmp_path):
    marker = tmp_path / "pwned"
    _write(tmp_path / "requests_rank0.db", {"a": (-1.25, True), "b": "generated text", "c": -3.5})
    assert check_cache_files(tmp_path / "requests") == 3  # loglikelihood, generate_until, loglikelihood_rolling
    _write(tmp_path / "requests_rank1.db", {"a": (-1.0, False), "evil": Payload(marker)})
    with pytest.raises(UnsafeRequestCacheError, match=r"requests_rank1\.db holds something other than plain answers"):
        check_cache_files(tmp_path / "requests")
    assert not marker.exists()
    with sqlitedict.SqliteDict(str(tmp_path / "requests_rank1.db")) as db:  # the control: lm-eval's own read runs it
        db["evil"]
    assert marker.is_dir()


def test_a_file_that_is_not_a_cache_is_refused(tmp_path):
    (tmp_path / "requests_rank0.db").write_bytes(os.urandom(2048))
    with pytest.raises(UnsafeRequestCacheError, match="requests_rank0.db"):
        check_cache_files(tmp_path / "requests")


@pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")
def test_a_planted_cache_file_stops_the_evaluation_before_any_request(tmp_path, monkeypatch):
    """``evaluate_model(cache_dir=…)`` with a planted ``requests_rank0.db``: refused, no request answered."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from lit_dof.evaluation.harness import evaluate_model
    from lit_dof.evaluation.loading import load_model

    model, tokenizer = load_model(str(TINYSTORIES), device=torch.device("cpu"), dtype=None)
    marker = tmp_path / "pwned"
    (tmp_path / "cache").mkdir()
    _write(tmp_path / "cache" / "requests_rank0.db", {"x": Payload(marker)})
    monkeypatch.setattr(HFLM, "loglikelihood", lambda *a, **k: pytest.fail("a request ran"))
    with pytest.raises(UnsafeRequestCacheError):
        evaluate_model(model, tokenizer, ["wsc273"], data_dir=DATA, limit=2, cache_dir=tmp_path / "cache")
    assert not marker.exists()
    assert request_cache(tmp_path / "fresh", model) == str(tmp_path / "fresh" / "requests")  # an empty folder is fine
