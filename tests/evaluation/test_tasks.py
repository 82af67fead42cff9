"""Task readers against SOURCES.md (record counts, file quirks) and lm-eval's scores against a direct
log-likelihood reference computed here with the model itself."""

from __future__ import annotations

import collections
import json
import math
import xml.etree.ElementTree as ET

import pytest
import torch

from lit_dof.evaluation import task_data
from tests.conftest import REPO, TINYSTORIES

DATA = REPO.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


@pytest.mark.parametrize("task", task_data.TASKS)
def test_record_counts_match_sources(task):
    docs = task_data.load_task(task, DATA)
    assert len(docs) == task_data.EXPECTED_COUNTS[task]
    for doc in docs:
        options = doc.get("choices") or doc["contexts"]
        assert 0 <= doc["gold"] < len(options) and all(isinstance(o, str) and o for o in options)


def test_file_quirks():
    """ARC digit keys map to the right choice; WSC answers with a trailing '.' parse; MMLU subsets stratify."""
    raw = [json.loads(line) for line in (DATA / "arc/ARC-Easy-Test.jsonl").read_text().splitlines()]
    docs = task_data.arc_easy(DATA)
    digit = [(r, d) for r, d in zip(raw, docs) if r["answerKey"].isdigit()]
    assert len(digit) == 97  # SOURCES.md
    for r, d in digit:
        chosen = next(c["text"] for c in r["question"]["choices"] if c["label"] == r["answerKey"])
        assert d["choices"][d["gold"]] == chosen
    schemas = ET.fromstring((DATA / "wsc273/WSCollection.xml").read_bytes()).findall("schema")[:273]
    dotted = [s.find("correctAnswer").text.strip().endswith(".") for s in schemas]
    assert sum(dotted) > 0  # the quirk is present in WSC273 and parsed (counts above)
    golds = collections.Counter(d["gold"] for d in task_data.wsc273(DATA))
    assert golds[0] > 100 and golds[1] > 100
    subset = task_data.mmlu(DATA, per_subject=18)
    per_subject = collections.Counter(d["subject"] for d in subset)
    assert len(subset) == 1026 and len(per_subject) == 57 and set(per_subject.values()) == {18}
    assert task_data.logiqa(DATA)[0]["choices"][0].startswith("Civic Park")  # "A." prefix removed
    with pytest.raises(FileNotFoundError, match="Task data layout"):
        task_data.piqa(DATA / "nowhere")
    with pytest.raises(ValueError, match="known: piqa"):
        task_data.load_task("hellaswag", DATA)


def _loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context), split the way lm-eval splits a pair: trailing context spaces move to the
    continuation, whose tokens are the tail of the joint encoding after the context's own encoding."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tokenizer(context)["input_ids"]  # the tokenizer's own special-token default, as lm-eval
    target_ids = tokenizer(context + continuation)["input_ids"][len(context_ids) :]  # lm-eval's split
    n_context = len(context_ids)
    ids = torch.tensor([context_ids + target_ids])
    with torch.no_grad():
        logprobs = model(ids).logits[0, :-1].float().log_softmax(-1)
    target = ids[0, n_context:]
    return float(logprobs[n_context - 1 :].gather(-1, target[:, None]).sum())


def test_lm_eval_scores_match_direct_loglikelihoods():
    """acc / acc_norm from lm-eval (through our task YAMLs) equal argmax log-likelihood computed here."""
    from lit_dof.evaluation.harness import evaluate_model
    from lit_dof.teacher.loading import load_teacher

    model, tokenizer = load_teacher(TINYSTORIES)
    limit = 24
    results = evaluate_model(model, tokenizer, ["arc_easy", "winogrande"], data_dir=DATA, limit=limit, batch_size=8)
    arc = task_data.arc_easy(DATA)[:limit]
    hits, hits_norm = [], []
    for doc in arc:
        ll = [_loglikelihood(model, tokenizer, doc["query"], " " + c) for c in doc["choices"]]
        hits.append(float(max(range(len(ll)), key=ll.__getitem__) == doc["gold"]))
        normed = [value / len(c) for value, c in zip(ll, doc["choices"])]
        hits_norm.append(float(max(range(len(ll)), key=normed.__getitem__) == doc["gold"]))
    acc, acc_norm = sum(hits), sum(hits_norm)
    assert results["tasks"]["arc_easy"]["acc"] == pytest.approx(acc / limit)
    assert results["tasks"]["arc_easy"]["acc_norm"] == pytest.approx(acc_norm / limit)
    # per-item scores, in document order (what paired comparisons of two models use)
    assert results["tasks"]["arc_easy"]["items"] == {"acc": hits, "acc_norm": hits_norm}
    wino = task_data.winogrande(DATA)[:limit]
    correct = sum(
        max(range(2), key=lambda i: _loglikelihood(model, tokenizer, d["contexts"][i], " " + d["continuation"]))
        == d["gold"]
        for d in wino
    )
    assert results["tasks"]["winogrande"]["acc"] == pytest.approx(correct / limit)
    entry = results["tasks"]["arc_easy"]
    assert entry["n"] == limit
    assert entry["acc_stderr"] == pytest.approx(math.sqrt(acc / limit * (1 - acc / limit) / (limit - 1)))
    assert results["provenance"]["versions"]["lm_eval"] == "0.4.13"


def test_task_files_name_what_each_reader_reads(tmp_path):
    """:data:`TASK_FILES` (what the eval command checks before loading a model) agrees with the readers: every
    task's files are in the shared data, and a reader of an empty folder names the first one."""
    from lit_dof.evaluation.task_data import TASK_FILES, TaskDataError, check_task_data, load_task

    check_task_data(TASK_FILES, DATA)
    for task, patterns in TASK_FILES.items():
        with pytest.raises(FileNotFoundError) as missing:
            load_task(task, tmp_path)
        assert str(tmp_path / patterns[0].split("*")[0]) in str(missing.value)
        with pytest.raises(TaskDataError, match=f"no data for task\\(s\\) {task} in "):
            check_task_data([task, "passkey"], tmp_path)
