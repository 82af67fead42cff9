"""Multiple-choice scoring: option scores equal lm-eval-style log-likelihoods; the score matrix pads with −inf."""

from __future__ import annotations

import pytest
import torch

from lit_dof.evaluation import task_data
from lit_dof.evaluation.multiple_choice import collate_choices, option_scores, score_matrix
from tests.conftest import REPO, TINYSTORIES
from tests.evaluation.test_tasks import _loglikelihood

DATA = REPO.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


def _teacher():
    from lit_dof.teacher.loading import load_teacher

    return load_teacher(TINYSTORIES)


def test_option_scores_match_direct_loglikelihoods():
    model, tokenizer = _teacher()
    docs = task_data.arc_easy(DATA)[:3] + task_data.winogrande(DATA)[:2]  # 4-5 choices and partial evaluation
    batch = collate_choices(docs, tokenizer, max_length=512)
    with torch.no_grad():
        scores = option_scores(model, batch)
    expected = []
    for doc in docs:
        if "choices" in doc:
            expected += [_loglikelihood(model, tokenizer, doc["query"], " " + c) for c in doc["choices"]]
        else:
            expected += [_loglikelihood(model, tokenizer, c, " " + doc["continuation"]) for c in doc["contexts"]]
    torch.testing.assert_close(scores, torch.tensor(expected), rtol=1e-4, atol=1e-3)
    matrix = score_matrix(scores, batch)
    assert matrix.shape == (5, max(len(d.get("choices") or d["contexts"]) for d in docs))
    assert torch.isinf(matrix[3:, 2:]).all()  # the 2-option documents are padded with −inf
