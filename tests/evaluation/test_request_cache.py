"""The eval request cache (``cache_dir``): a second run serves every answered request from the cache with
the same numbers as an uncached run, a longer run computes only the new requests, and a cache of other
weights or settings is refused before any request runs."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import DATA, TINYSTORIES

pytest.importorskip("lm_eval")
pytestmark = pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")


@pytest.fixture(scope="module")
def tiny():
    from lit_dof.evaluation.loading import load_model

    return load_model(str(TINYSTORIES), device=torch.device("cpu"), dtype=None)


@pytest.fixture
def computed(monkeypatch):
    """Counts the loglikelihood requests the model itself answers (not the cache)."""
    from lm_eval.models.huggingface import HFLM

    counts = []
    answer = HFLM.loglikelihood

    def counting(self, requests, *args, **kwargs):
        counts.append(len(requests))
        return answer(self, requests, *args, **kwargs)

    monkeypatch.setattr(HFLM, "loglikelihood", counting)
    return counts


def _run(model, tokenizer, limit, **kwargs):
    from lit_dof.evaluation.harness import evaluate_model

    return evaluate_model(model, tokenizer, ["wsc273"], data_dir=DATA, limit=limit, batch_size=4, **kwargs)


def test_cached_runs_equal_the_uncached_run_and_compute_only_new_requests(tiny, computed, tmp_path):
    model, tokenizer = tiny
    reference = _run(model, tokenizer, 4)["tasks"]  # no cache: 4 examples x 2 candidates
    assert sum(computed) == 8
    computed.clear()
    first = _run(model, tokenizer, 2, cache_dir=tmp_path / "cache")["tasks"]
    assert sum(computed) == 4
    computed.clear()
    resumed = _run(model, tokenizer, 4, cache_dir=tmp_path / "cache")["tasks"]
    assert sum(computed) == 4  # the first two examples' requests came from the cache
    assert resumed == reference
    assert first["wsc273"]["items"]["acc"] == reference["wsc273"]["items"]["acc"][:2]
    computed.clear()
    again = _run(model, tokenizer, 4, cache_dir=tmp_path / "cache")["tasks"]
    assert sum(computed) == 0 and again == reference
    assert json.loads((tmp_path / "cache" / "model.json").read_text())["batch_size"] == 4


def test_a_cache_of_other_weights_or_settings_is_refused_before_any_request(tiny, computed, tmp_path):
    from lit_dof.evaluation.harness import evaluate_model, weights_digest

    model, tokenizer = tiny
    _run(model, tokenizer, 1, cache_dir=tmp_path / "cache")
    computed.clear()
    with pytest.raises(ValueError, match="batch_size differ.*another cache folder or delete"):
        evaluate_model(model, tokenizer, ["wsc273"], data_dir=DATA, limit=1, batch_size=8,
                       cache_dir=tmp_path / "cache")  # fmt: skip  # packed args
    original = weights_digest(model)
    parameter = next(model.parameters())
    kept = parameter.detach().clone()
    with torch.no_grad():
        parameter.view(-1)[0] += 1e-3
    try:
        assert weights_digest(model) != original
        with pytest.raises(ValueError, match="weights_sha256 differ"):
            _run(model, tokenizer, 1, cache_dir=tmp_path / "cache")
    finally:
        with torch.no_grad():
            parameter.copy_(kept)
    assert computed == []
