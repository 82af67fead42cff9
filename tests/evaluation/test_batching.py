"""Loglikelihood batches bounded by their logits' bytes (``lit_dof.evaluation.batching``): the closed form, and on
the tiny real teacher every forward within the bound with the same answers as unbounded batches."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import DATA, TINYSTORIES

pytest.importorskip("lm_eval")


def test_bounded_batch_size_is_the_closed_form():
    from lit_dof.evaluation.batching import bounded_batch_size

    assert bounded_batch_size(16, 3040, 49152, 2**31) == 3  # 5-shot MMLU's longest prompt on SmolLM2
    assert bounded_batch_size(16, 100, 49152, 2**31) == 16  # short prompts: the batch size itself
    assert bounded_batch_size(16, 3040, 262144, 2**31) == 1  # Gemma 3's vocabulary: one at a time
    assert bounded_batch_size(4, 10, 7, 4 * 7 * 10 * 2) == 2 and bounded_batch_size(4, 10, 7, 1) == 1
    with pytest.raises(ValueError, match="must be ≥ 1"):
        bounded_batch_size(0, 10, 7, 100)


@pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")
def test_every_forward_stays_within_the_bound_and_the_answers_do_not_change(monkeypatch):
    from lm_eval.models.huggingface import HFLM

    from lit_dof.evaluation.harness import evaluate_model
    from lit_dof.evaluation.loading import load_model

    model, tokenizer = load_model(str(TINYSTORIES), device=torch.device("cpu"), dtype=None)
    vocab = model.get_output_embeddings().weight.shape[0]
    shapes = []
    call = HFLM._model_call

    def recording(self, inputs, *args, **kwargs):
        shapes.append(tuple(inputs.shape))
        return call(self, inputs, *args, **kwargs)

    answers = []
    answer = HFLM.loglikelihood

    def answering(self, requests, *args, **kwargs):
        answers.append(answer(self, requests, *args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(HFLM, "_model_call", recording)
    monkeypatch.setattr(HFLM, "loglikelihood", answering)
    run = dict(data_dir=DATA, limit=6, batch_size=8)
    free = evaluate_model(model, tokenizer, ["wsc273"], max_logits_bytes=2**40, **run)
    longest = max(t for _, t in shapes)
    assert max(b for b, _ in shapes) > 2  # unbounded: batches of several requests
    shapes.clear()
    bound = 4 * vocab * longest * 2  # room for two of the longest request
    bounded = evaluate_model(model, tokenizer, ["wsc273"], max_logits_bytes=bound, **run)
    assert shapes and all(b * t * vocab * 4 <= bound for b, t in shapes)
    assert bounded["provenance"]["batch_sizes_used"] == [2] and free["provenance"]["batch_sizes_used"] == [8]
    got, want = bounded["tasks"]["wsc273"], free["tasks"]["wsc273"]
    assert got["items"]["acc"] == want["items"]["acc"] and got["acc"] == want["acc"]
    (free_answers, bounded_answers) = answers
    assert [g for _, g in bounded_answers] == [g for _, g in free_answers]  # greedy flags
    assert [ll for ll, _ in bounded_answers] == pytest.approx([ll for ll, _ in free_answers], abs=1e-4)
