"""``lit-dof hybrid`` end to end on the tiny real TinyStories Llama: items, local losses, search, export,
held-out comparison, report; resume re-scores nothing; bad settings fail clearly."""

from __future__ import annotations

import json

import pytest
import torch

from lit_dof.attention import LearnedPRF
from lit_dof.hybrid.items import task_items
from lit_dof.hybrid.orderings import default_counts
from lit_dof.hybrid.record import SearchRecord
from lit_dof.hybrid.state import hybrid_key
from lit_dof.students import linearize, load_student
from tests.conftest import REPO, TINYSTORIES

DATA = REPO.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA.is_dir() and TINYSTORIES.is_dir()), reason="../shared not present")


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    from lit_dof.teacher.loading import load_teacher

    torch.manual_seed(0)
    teacher, tokenizer = load_teacher(TINYSTORIES)
    student = linearize(teacher, LearnedPRF, [4, 8]).eval()  # 2 layers
    path = tmp_path_factory.mktemp("bank") / "student"
    student.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@needs_data
def test_search_exports_reports_and_resumes(bank, tmp_path, capsys):
    from lit_dof.hybrid.cli import main

    out = tmp_path / "search"
    args = ["--bank", str(bank), "--task", "arc_easy", "--data_dir", str(DATA), "--search_items", "12",
            "--heldout_items", "16", "--tolerance", "1.0", "--shortlist", "loss", "--shortlist_k", "2",
            "--batch_size", "6", "--confirm_items", "8", "--verify_items", "20", "--out",
            str(out)]  # fmt: skip  # compact list
    main(args)
    data = json.loads((out / "search.json").read_text())
    L = data["num_layers"]
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[hybrid]")]
    rounds = [line for line in progress if " round " in line]  # stderr: each round, elapsed, ETA
    assert [line.split(" done: ")[0] for line in rounds] == [f"[hybrid] round {k}/{L}" for k in range(1, L + 1)]
    assert rounds[0].split(" done: ")[1].startswith(f"layer {data['rounds'][0]['chosen']} linear, score")
    assert progress[0].startswith("[hybrid] stage 1/7 bank") and progress[-1].startswith("[hybrid] stage 7/7 done")
    # tolerance 1.0 accepts every swap: the search makes every layer linear, two candidates per round
    # (one in the last round), each the lower-local-loss ones among the remaining layers
    assert len(data["rounds"]) == L and data["search"]["most_linear"] == list(range(L))
    assert data["search"]["evaluations"] == 1 + 2 * (L - 1) + 1
    loss = {int(i): v for i, v in data["local_loss"].items()}
    for r in data["rounds"]:
        remaining = sorted(set(range(L)) - set(r["linear"]) | {r["chosen"]}, key=lambda i: (loss[i], i))
        assert sorted(map(int, r["scores"])) == sorted(remaining[:2])
    # confirmation: the most linear hybrid passes at once (tolerance 1.0), after the teacher
    assert data["confirm"]["items"] == 8 and list(data["confirm"]["scores"]) == ["teacher", hybrid_key(range(L))]
    assert data["confirm"]["most_linear"] == list(range(L)) and data["teacher"] == str(TINYSTORIES)
    assert "Confirmation on 8 validation items" in (out / "hybrid.md").read_text()
    # exports carry their hybrid configuration
    for name in ("best", "most_linear"):
        exported = load_student(out / name)
        linear = data["exported"][name]["linear"]
        assert [i for i, on in enumerate(exported.linear_layers) if on] == linear
    # held-out curves for all five orderings at the default counts, first k of each order
    assert set(data["curves"]) == {"greedy", "dof", "loss", "uniform", "random"}
    assert data["counts"] == default_counts(L, L)
    for name, order in data["orders"].items():
        assert sorted(order) == list(range(L))
        for k, score in data["curves"][name].items():
            assert data["heldout"][hybrid_key(order[: int(k)])]["score"] == score
    # verification: the teacher and both exports on 20 test items, scored without the prefix cache, equal to a
    # direct computation on those items
    from lit_dof.hybrid.scoring import HybridScorer, choice_batches
    from lit_dof.teacher.loading import load_tokenizer

    verify = data["verify"]
    exported = {hybrid_key(e["linear"]) for e in data["exported"].values()}
    assert verify["items"] == 20 and set(verify["scores"]) == {"teacher", *exported}
    docs = task_items("arc_easy", DATA, 12, 20)[2]
    direct = HybridScorer(load_student(bank).eval(), choice_batches(docs, load_tokenizer(bank), 6), prefix_cache=False)
    assert verify["scores"]["teacher"]["score"] == pytest.approx(direct(frozenset()))
    linear = data["exported"]["most_linear"]["linear"]
    assert verify["scores"][hybrid_key(linear)]["score"] == pytest.approx(direct(frozenset(linear)))
    md = (out / "hybrid.md").read_text()
    assert "greedy search" in md and "Winner per count" in md and "lit-dof hybrid --bank" in md
    assert "Verification on 20 held-out items" in md
    assert (out / "hybrid.png").stat().st_size > 1000
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))
    # resume: everything is found in search.json, nothing is scored again
    from lit_dof.hybrid import scoring

    calls = []
    original = scoring.HybridScorer.__call__
    scoring.HybridScorer.__call__ = lambda self, linear: calls.append(linear) or original(self, linear)
    try:
        main(args)
    finally:
        scoring.HybridScorer.__call__ = original
    assert calls == [] and json.loads((out / "search.json").read_text())["rounds"] == data["rounds"]
    with pytest.raises(ValueError, match="other settings"):
        main([*args[:-2], "--tolerance", "0.5", "--out", str(out)])


@needs_data
def test_search_on_perplexity_exports_the_teacher_when_no_swap_passes(bank, tmp_path):
    from lit_dof.hybrid.run import HybridSearch
    from tests.conftest import WIKIPEDIA

    def search(*args, **kwargs):
        return HybridSearch(*args, **kwargs).run()

    # untrained twins raise the perplexity of every single-layer swap: with a zero tolerance none passes
    record = search(
        str(bank),
        metric="perplexity",
        corpus=str(WIKIPEDIA),
        block=32,
        search_items=3,
        heldout_items=2,
        tolerance=0.0,
        shortlist=None,
        out=str(tmp_path / "s"),
        orderings=["dof", "uniform"],
        confirm_items=2,
        verify_items=2,
    )
    assert record == SearchRecord.load(tmp_path / "s" / "search.json")
    assert list(record.confirm.scores) == ["teacher"] and record.confirm.most_linear == []  # nothing to confirm
    assert len(record.rounds) == 1 and not record.rounds[0].passed
    assert min(record.rounds[0].scores.values()) > record.teacher_search_score
    assert record.search.most_linear == record.search.best == []
    assert not any(load_student(tmp_path / "s" / "most_linear").linear_layers)
    assert set(record.curves) == {"dof", "uniform"} and record.counts == [1, 2]  # 2 layers
    # perplexity: lower is better, so the threshold lies above the teacher
    assert record.heldout_threshold == record.teacher_heldout
    # verification: two further blocks, after the search, held-out and confirmation blocks
    assert record.verify.items == 2 and list(record.verify.scores) == ["teacher"]
    assert record.verify.threshold == record.verify.scores["teacher"].score > 1
    with pytest.raises(ValueError, match="shortlist"):
        search(str(bank), data_dir=str(DATA), shortlist="random", out=str(tmp_path / "t"))
    with pytest.raises(FileNotFoundError, match="hybrid/twins.yaml"):
        search(str(tmp_path / "missing"), data_dir=str(DATA), out=str(tmp_path / "u"))


@needs_data
def test_search_runs_in_the_dtype_asked_for_and_records_device_and_dtype(bank, tmp_path):
    from lit_dof.hybrid.cli import search
    from lit_dof.hybrid.run import HybridSearch
    from tests.conftest import WIKIPEDIA

    settings = HybridSearch(
        str(bank),
        metric="perplexity",
        corpus=str(WIKIPEDIA),
        block=32,
        search_items=2,
        heldout_items=2,
        tolerance=0.0,
        shortlist=None,
        out=str(tmp_path / "s"),
        orderings=["uniform"],
        device="cpu",
        dtype="bfloat16",
    )
    record = search(settings)
    assert record.device == "cpu" and record.dtype == "bfloat16" and record.settings.dtype == "bfloat16"
    exported = load_student(tmp_path / "s" / "most_linear")
    assert exported.dtype == torch.bfloat16  # exported in the dtype it was searched in, feature maps in float32
    assert all(p.dtype == torch.float32 for m in exported.linear_modules().values() for p in m.parameters())


@pytest.mark.parametrize(
    "option, message",
    [
        ("--device=tpu", "device 'tpu': use auto, cpu, cuda or cuda:N"),
        ("--dtype=float64", "'auto', 'float32', 'bfloat16', 'float16'"),
    ],
)
def test_bad_device_or_dtype_is_refused_before_the_bank_loads(capsys, tmp_path, option, message):
    from lit_dof.hybrid.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--bank", str(tmp_path / "missing"), "--out", str(tmp_path / "s"), option])  # no bank: not loaded
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
