"""The comparison runner end to end on the tiny real teacher: cells, report, resume without recomputation."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from dataclasses import fields, replace

import pytest
import torch
from transformers import AutoConfig

from lit_dof.comparison.artefacts import checkpoint_dof_report
from lit_dof.comparison.cells import Comparison
from lit_dof.comparison.cli import compare, main
from lit_dof.comparison.collect import collect
from lit_dof.comparison.plots import figure, plot
from lit_dof.comparison.records import Report
from lit_dof.comparison.render import _fmt_tokens, curve_table, markdown, paired_table, seed_table
from lit_dof.comparison.report import write_report
from lit_dof.comparison.rows import PLANNER_ARGS, ROWS, planner_class
from lit_dof.devices import DeviceError, device_label
from lit_dof.evaluation.stats import paired_difference
from lit_dof.generation import teacher_kv_nbytes
from lit_dof.students.state_bytes import STATE_LAYOUT
from tests.conftest import REPO, TINYSTORIES, WIKIPEDIA
from tests.pipeline.conftest import SCHEDULE

DATA = REPO.parent / "shared" / "data"
TINY_FIT = [
    "--data.init_args.seq_len=64", "--data.init_args.batch_size=2", "--data.init_args.val_blocks=2",
    f"{PLANNER_ARGS}.num_samples=64", f"{PLANNER_ARGS}.num_batches=2", "--model.init_args.query_rows=32",
    "--trainer.enable_progress_bar=false", "--trainer.max_steps=3", "--trainer.val_check_interval=3",
    "--config", str(SCHEDULE),  # the schedule these tests are written for, whatever the quickstart's
]  # fmt: skip  # compact list


def run_compare(**kwargs) -> dict:
    """:func:`compare` with the :class:`Comparison` fields among ``kwargs`` (``out``, ``teacher``, …) gathered into
    its ``comparison``, as ``lit-dof compare`` gathers its options; the report as ``comparison.json`` holds it."""
    names = {f.name for f in fields(Comparison)}
    comparison = Comparison(**{k: v for k, v in kwargs.items() if k in names})
    return compare(comparison, **{k: v for k, v in kwargs.items() if k not in names}).to_json()


def collect_json(*args, previous: dict | None = None, **kwargs) -> dict:
    """:func:`collect`'s report as ``comparison.json`` holds it, ``previous`` given in that form too."""
    previous = Report.from_json(previous) if previous is not None else None
    return collect(*args, previous=previous, **kwargs).to_json()


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_compare_runs_resumes_and_reports(tmp_path, monkeypatch):
    kwargs = dict(rows=["teacher", "performer", "fix", "dof"], budgets=[16], out=str(tmp_path / "cells"),
                  teacher=str(TINYSTORIES), corpus=str(WIKIPEDIA), data_dir=str(DATA), eval_limit=6,
                  mmlu_per_subject=1, ppl_tokens=300, fit_args=TINY_FIT)  # fmt: skip  # packed args
    report = run_compare(**kwargs)
    cells = {c["row"]: c for c in report["cells"]}
    assert set(cells) == {"teacher", "performer", "fix", "dof"}
    record = json.loads((tmp_path / "cells" / "C16" / "teacher" / "ppl.json").read_text())
    assert str(REPO.parent) not in record["source"] and record["source"].endswith(WIKIPEDIA.name)  # portable
    by_position = record["by_position"]
    assert by_position["block"] == 300
    assert set(by_position["buckets"]) == {"0-63", "64-255", "256-299"}  # one short block
    assert "Perplexity by token position (1 disjoint block of 300" in (tmp_path / "cells" / "comparison.md").read_text()
    teacher_config = AutoConfig.from_pretrained(TINYSTORIES)  # its KV cache at the scored context, closed form
    kv = [teacher_kv_nbytes(teacher_config, t, torch.float32) for t in (512, 513)]
    state = {"context": 512, "bytes": kv[0], "growth": kv[1] - kv[0], "layout": STATE_LAYOUT}
    assert record["state"] == state  # and its bytes at any longer context
    assert cells["teacher"]["state"] == record["state"]  # the report carries it (tools/state_retrieval_plot.py)
    assert (tmp_path / "cells" / "C16" / "teacher" / "eval" / "cache" / "model.json").is_file()  # resumable tasks
    assert cells["teacher"]["gap_closed"] == pytest.approx(1.0)
    assert cells["performer"]["gap_closed"] == pytest.approx(0.0)
    fix, dof = cells["fix"]["fit"], cells["dof"]["fit"]
    assert fix["feature_dims"] == [16, 16] and fix["steps"] == 3 and fix["tokens"] == 3 * 2 * 64
    assert dof["feature_dims"] != [16, 16] and dof["total_features"] >= 31  # L · C up to rounding, + the min_dim floor
    assert dof["lam_rule"] == "auto" and dof["num_samples"] == 64
    assert [step for step, _ in fix["val_curve"]] == [2]  # one validation at the end (step index of the 3rd step)
    for c in cells.values():
        assert c["ppl"] > 1 and len(c["scores"]) == 7 and c["average"] is not None
    for row in ("performer", "fix", "dof"):  # a linear student's state: constant, below the teacher's KV cache
        assert 0 < cells[row]["state"]["bytes"] < cells["teacher"]["state"]["bytes"]
    table = (tmp_path / "cells" / "comparison.md").read_text()
    needles = ("| teacher |", "| performer |", "| fix |", "| dof |", "arc_easy", "wsc273", "gap closed", "λ", "tokens",
               " MiB @ 512 |")  # fmt: skip  # compact tuple
    for needle in needles:
        assert needle in table
    assert "| 384 |" in table.split("| fix |")[1].splitlines()[0]  # tokens seen: 3 steps × 2 × 64, not "0.00M"
    assert (tmp_path / "cells" / "comparison.png").stat().st_size > 0
    assert str(REPO) not in fix["command"] and fix["command"].startswith("python -m lit_dof fit")
    device = device_label("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    assert fix["device"] == device and f"Device: {device} (every cell)." in table  # fits, ppl and evaluations

    # Re-running skips every finished cell: no fit subprocess, no evaluation, same report.
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "cells").rglob("eval/*.json")}

    def refuse(*args, **kwargs):
        raise AssertionError("a finished cell was re-fitted")

    monkeypatch.setattr(subprocess, "run", refuse)
    again = run_compare(**kwargs)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert json.dumps(again, sort_keys=True) == json.dumps(report, sort_keys=True)
    # a record counted in an older state layout (no layout, no growth, other bytes) is re-derived when read back
    path = tmp_path / "cells" / "C16" / "dof" / "ppl.json"
    old = json.loads(path.read_text())
    stale = {"context": old["state"]["context"], "bytes": old["state"]["bytes"] + 1000}
    path.write_text(json.dumps({**old, "state": stale}))
    assert json.dumps(run_compare(**kwargs), sort_keys=True) == json.dumps(report, sort_keys=True)
    assert json.loads(path.read_text())["state"] == {**old["state"], "before": {"bytes": stale["bytes"], "layout": 1}}
    assert old["state"]["growth"] == 0  # pure linear
    with pytest.raises(ValueError, match="unknown row"):
        run_compare(**{**kwargs, "rows": ["softmax"]})
    with pytest.raises(ValueError, match="unknown task"):
        run_compare(**{**kwargs, "tasks": ["hellaswag"]})
    # `tasks` limits what the eval stage runs now: a new budget's cells get only those task files
    monkeypatch.undo()  # lm-eval itself runs git in a subprocess
    run_compare(**{**kwargs, "rows": ["teacher"], "out": str(tmp_path / "few"), "tasks": ["wsc273"]})
    assert [p.name for p in (tmp_path / "few").rglob("eval/*.json")] == ["wsc273.json"]

    # A second seed: only its new cell is fitted, in seed1/, with the seed passed to the fit; the draw differs
    seeded = run_compare(**{**kwargs, "rows": ["fix"], "seeds": [0, 1], "stages": ["fit"]})
    first, second = (tmp_path / "cells" / "C16" / "fix", tmp_path / "cells" / "C16" / "seed1" / "fix")
    record = json.loads((second / "fit.json").read_text())
    assert (
        f"--seed_everything=1 --data.init_args.shuffle_seed=1 {PLANNER_ARGS}.seed=1" in record["command"]
        and "--seed_everything" not in fix["command"]
        and "shuffle_seed" not in fix["command"]
    )
    assert f"{PLANNER_ARGS}.budget=16" in record["command"]
    weights = [first_z(cell / json.loads((cell / "fit.json").read_text())["student"]) for cell in (first, second)]
    assert weights[0].shape == weights[1].shape and not torch.equal(*weights)
    labels = [(c["row"], c["seed"], c["label"]) for c in seeded["cells"]]
    assert labels == [("fix", 0, "fix"), ("fix", 1, "fix (seed 1)")]
    with pytest.raises(ValueError, match="distinct integers"):
        run_compare(**{**kwargs, "seeds": [1, 1]})


def first_z(student) -> torch.Tensor:
    """The first layer's learned feature directions z of an exported student."""
    from safetensors.torch import load_file

    tensors = load_file(str(next(student.glob("*.safetensors"))))
    return next(value for name, value in sorted(tensors.items()) if name.endswith(".z"))


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")
def test_finetune_stage_selects_the_lr_on_the_teacher_and_reuses_it(tmp_path):
    kwargs = dict(rows=["teacher", "fix"], budgets=[16], out=str(tmp_path / "cells"), teacher=str(TINYSTORIES),
                  corpus=str(WIKIPEDIA), data_dir=str(DATA), fit_args=TINY_FIT, stages=["fit", "finetune"],
                  finetune_tasks=["arc_easy"], finetune_lrs=[1e-6, 3e-3],
                  finetune_args=["--data.init_args.train_limit=8", "--data.init_args.choose_limit=8",
                                 "--data.init_args.report_limit=6",
                                 "--trainer.max_epochs=1",
                                 "--trainer.enable_progress_bar=false"])  # fmt: skip  # packed args
    report = run_compare(**kwargs)
    folder = tmp_path / "cells" / "finetune_lr" / "arc_easy"
    selected = json.loads((folder / "selected.json").read_text())
    runs = {lr: json.loads((folder / f"lr{lr:g}" / "result.json").read_text()) for lr in (1e-6, 3e-3)}
    assert selected["scores"] == {f"{lr:g}": run["choose_score"] for lr, run in runs.items()}  # chosen on choose
    assert selected["lr"] == max(sorted(runs), key=lambda lr: runs[lr]["choose_score"])
    cells = {c["row"]: c for c in report["cells"]}
    student = json.loads((tmp_path / "cells" / "C16" / "fix" / "finetune" / "arc_easy.json").read_text())
    assert student["lr"] == selected["lr"] and student["model"].endswith("student")
    assert cells["fix"]["finetuned"]["arc_easy"] == student["score"] and "arc_easy" in cells["teacher"]["finetuned"]
    assert cells["fix"]["finetuned_before"]["arc_easy"] == student["zero_shot"] == student["before"]["report"]["acc"]
    assert "Fine-tuned per task" in (tmp_path / "cells" / "comparison.md").read_text()


def test_a_grid_run_without_a_choose_score_is_refused(tmp_path):
    from lit_dof.comparison.cells import Comparison

    comparison = Comparison(out=str(tmp_path), teacher=str(TINYSTORIES), finetune_lrs=[1e-5])
    folder = tmp_path / "finetune_lr" / "piqa" / "lr1e-05"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"score": 0.5}))  # a run of the old protocol
    with pytest.raises(ValueError, match="no choose-split score.*delete that folder"):
        comparison.finetune_lr("piqa")


def test_relative_paths_are_resolved_before_the_fits_run_in_the_cell_directory(tmp_path, monkeypatch):
    """Fits run with the cell directory as working directory: a relative ``--corpus`` / ``--data_dir`` /
    teacher path from the user's shell must reach them as the same file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("text")
    (tmp_path / "data").mkdir()
    (tmp_path / "teacher").mkdir()
    runner = Comparison(
        out=tmp_path / "cells", corpus="corpus.txt", data_dir="data", teacher="teacher", base_config="base.yaml"
    )
    command = runner.fit_command(ROWS["fix"], 16, resume=False)
    assert f"--data.init_args.path={tmp_path / 'corpus.txt'}" in command
    assert f"--model.init_args.teacher={tmp_path / 'teacher'}" in command
    assert command[command.index("--config") + 1] == str(tmp_path / "base.yaml")
    assert runner.data_dir == str(tmp_path / "data")
    hub = Comparison(out=tmp_path / "cells", teacher="HuggingFaceTB/SmolLM2-135M")  # a hub id stays one
    assert hub.teacher == "HuggingFaceTB/SmolLM2-135M"


def test_an_interrupted_fit_attempt_still_counts_towards_the_wall_time(tmp_path, monkeypatch):
    runner = Comparison(out=tmp_path, corpus=str(tmp_path / "corpus.txt"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.fit(ROWS["fix"], 16)
    attempts = json.loads((tmp_path / "C16" / "fix" / "fit_attempts.json").read_text())
    assert len(attempts) == 1 and attempts[0]["returncode"] is None and attempts[0]["seconds"] >= 0
    assert not (tmp_path / "C16" / "fix" / "fit.json").exists()  # not finished: the next run resumes it

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 3))
    with pytest.raises(RuntimeError, match="failed with code 3"):
        runner.fit(ROWS["fix"], 16)
    attempts = json.loads((tmp_path / "C16" / "fix" / "fit_attempts.json").read_text())
    assert [a["returncode"] for a in attempts] == [None, 3]
    report = collect_json(runner, [ROWS["fix"]], [16])
    assert report["pending"] == ["fix (fit failed with code 3: see fix/fit.log)"]

    # Lightning ends a fit sent SIGTERM with code 0 before its export: stopped, not finished, and not failed
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
    with pytest.raises(RuntimeError, match="stopped before its last step .* resume it from its last checkpoint"):
        runner.fit(ROWS["fix"], 16)
    last = json.loads((tmp_path / "C16" / "fix" / "fit_attempts.json").read_text())[-1]
    assert last["returncode"] == 0 and last["exported"] is False
    assert not (tmp_path / "C16" / "fix" / "fit.json").exists()
    report = collect_json(runner, [ROWS["fix"]], [16])
    assert report["pending"] == ["fix (fit unfinished: it resumes from its last checkpoint)"]


def test_a_resumed_fit_rebuilds_its_checkpoints_dof_dims(tmp_path, monkeypatch):
    """A resumed cell reads the dof.json of the fresh start its checkpoint continues (recorded in fit_attempts.json),
    so a DoF estimate that changed in between (code, data) cannot rebuild other feature dims than the checkpoint's —
    not a stale report of an earlier attempt that died before checkpointing."""
    runner = Comparison(out=tmp_path, corpus=str(tmp_path / "corpus.txt"))
    cell = tmp_path / "C16" / "dof"
    stale = cell / "runs" / "version_0" / "dof.json"  # an attempt killed before it could record anything
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    os.utime(stale, (1_000_000_000, 1_000_000_000))
    fresh = cell / "runs" / "version_1" / "dof.json"
    commands = []

    def fit(command, **kwargs):  # a fresh start writes its report, then dies after its first checkpoint
        commands.append(command)
        if not any(arg.startswith("--ckpt_path") for arg in command):
            fresh.parent.mkdir(parents=True)
            fresh.write_text("{}")
            (cell / "runs" / "checkpoints").mkdir()
            (cell / "runs" / "checkpoints" / "last.ckpt").write_bytes(b"")
        return subprocess.CompletedProcess(command, 3)

    monkeypatch.setattr(subprocess, "run", fit)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="failed with code 3"):
            runner.fit(ROWS["dof"], 16)
    assert not any(arg.startswith((f"{PLANNER_ARGS}.report_path", "--ckpt_path")) for arg in commands[0])  # fresh
    assert commands[1][-2:] == [f"{PLANNER_ARGS}.report_path={fresh.resolve()}", "--ckpt_path=last"]
    # without a recorded fresh start (killed before the record was written), the oldest report on disk
    (cell / "fit_attempts.json").write_text("[]")
    assert checkpoint_dof_report(cell, []) == stale.resolve()


def test_sigterm_to_the_runner_stops_it_like_ctrl_c_and_records_the_attempt(tmp_path, monkeypatch):
    def killed(*args, **kwargs):  # the runner itself gets SIGTERM while the fit runs
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGTERM did not stop the runner")

    monkeypatch.setattr(subprocess, "run", killed)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        main(["--rows=[fix]", "--budgets=[16]", f"--out={tmp_path}", "--stages=[fit]", "--device=cpu"])
    attempts = json.loads((tmp_path / "C16" / "fix" / "fit_attempts.json").read_text())
    assert len(attempts) == 1 and attempts[0]["returncode"] is None
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the runner's only while it runs


def test_curve_table_and_plot_compare_every_curve_with_fix_at_the_same_step(tmp_path):
    def cell(row, curve, dims):
        reference = None if row in ("fix", "fix_l2") else "fix_l2" if row.endswith("_l2") else "fix"
        return {"row": row, "note": "", "budget": 64, "kind": "student", "scores": {}, "average": None, "ppl": None,
                "finetuned": {}, "fit": {"val_curve": curve, "feature_dims": dims, "total_features": sum(dims)},
                "reference": reference}  # fmt: skip  # compact dict

    report = {"tasks": ["piqa"], "primary_metric": {"piqa": "acc_norm"}, "cells": [
        cell("fix", [(49, 400.0), (99, 200.0)], [64, 64]),
        cell("dof", [(49, 440.0), (99, 190.0)], [8, 120]),
        cell("dof_clip", [(49, 500.0)], [8, 64]),  # shorter curve: compared at its last shared step
    ]}  # fmt: skip  # compact dict
    per_head = cell("dof_head", [(49, 420.0), (99, 210.0)], [64, 64])  # per KV head: layer means 72 and 60
    per_head["fit"].update(feature_dims=[[16, 128], [8, 112]], total_features=132)
    with_head = Report.from_json({**report, "cells": [*report["cells"], per_head]})
    head_row = [line for line in curve_table(with_head, tail=2) if line.startswith("| dof_head |")]
    assert head_row[0].endswith("| 132 | 8…128 | 420.0 | 210.0 | 1.050 | 1.050 |")
    table = curve_table(Report.from_json(report), tail=2)
    rows = {line.split(" | ")[0].strip("| "): line for line in table if line.startswith("| ")}
    assert rows["fix"].endswith("| 400.0 | 200.0 | 1.000 | 1.000 |")
    assert rows["dof"].endswith("| 128 | 8…120 | 440.0 | 190.0 | 0.950 | 1.025 |")  # 190 / 200; (1.1 + 0.95) / 2
    assert rows["dof_clip"].endswith("| 500.0 | – | 1.250 | – |")  # 500 / 400 at step 49; one shared step < 2
    assert "| 49 | 99 | / vs (last) | / vs (mean of last 2) |" in rows["method"]
    # fewer shared validations than the tail (the full recipe's two, one per stage): no mean across stages
    five = {
        line.split(" | ")[0].strip("| "): line
        for line in curve_table(Report.from_json(report))
        if line.startswith("| ")
    }
    assert five["dof"].endswith("| 0.950 | – |") and "(mean of last 5)" in five["method"]
    assert rows["dof"].startswith("| dof | fix | 64 |") and rows["fix"].startswith("| fix | – | 64 |")
    with_l2 = {**report, "cells": [*report["cells"], cell("fix_l2", [(49, 800.0), (99, 400.0)], [64, 64]),
                                   cell("dof_l2", [(49, 600.0), (99, 380.0)], [8, 120])]}  # fmt: skip  # compact dict
    l2 = [line for line in curve_table(Report.from_json(with_l2)) if line.startswith("| dof_l2 |")]
    assert l2[0].endswith("| 0.950 | – |")  # against Fix-L2's curve: 380 / 400
    l2 = [line for line in curve_table(Report.from_json(with_l2), tail=2) if line.startswith("| dof_l2 |")]
    assert l2[0].endswith("| 0.950 | 0.850 |")  # (0.75 + 0.95) / 2
    ratio_panel = {
        line.get_label(): list(zip(*line.get_data())) for line in figure(Report.from_json(with_l2)).axes[2].lines
    }
    assert ratio_panel["dof_l2 / fix_l2 (C=64)"] == [(49, 0.75), (99, 0.95)]
    assert ratio_panel["dof / fix (C=64)"] == [(49, 1.1), (99, 0.95)]

    # a perplexity-only study (no task scores): the budget panel plots each cell's held-out perplexity
    for c, ppl in zip(report["cells"], (300.0, 280.0, 310.0)):
        c["ppl"] = ppl
    fig = figure(Report.from_json(report))
    budget_panel = {line.get_label(): list(zip(*line.get_data())) for line in fig.axes[0].lines}
    assert budget_panel == {"fix": [(128, 300.0)], "dof": [(128, 280.0)], "dof_clip": [(72, 310.0)]}
    assert fig.axes[0].get_ylabel() == "held-out perplexity (sliding window)"
    one = [line for line in curve_table(Report.from_json(report), tail=1) if line.startswith("| dof |")]
    assert one[0].endswith("| 0.950 | 0.950 |")
    assert curve_table(Report.from_json({**report, "cells": [cell("fix", [], [64])]})) == []
    # the perplexity footnote gives the setting, and flags cells measured differently
    for c, setting in zip(report["cells"], ["100 tokens, window 8, stride 4"] * 2 + ["200 tokens, window 8, stride 4"]):
        c["ppl_setting"] = setting
    assert "not comparable" in markdown(Report.from_json(report)) and "dof_clip: 200 tokens" in markdown(
        Report.from_json(report)
    )
    report["cells"][2]["ppl_setting"] = None
    assert "(100 tokens, window 8, stride 4)." in markdown(Report.from_json(report))
    assert "not comparable" not in markdown(Report.from_json(report))
    # no cell has task scores (a perplexity-only study): no task, average or gap columns
    header = markdown(Report.from_json(report)).splitlines()[0]
    assert header.startswith("| method | ppl | C |") and "piqa" not in header and "gap closed" not in header
    report["cells"][1]["fit"].update(strategy="dof", lam=2.0**-8, relative_to="trace")
    assert "| 2^-8.0 · tr(G)/J |" in markdown(Report.from_json(report))
    plot(Report.from_json(report), tmp_path / "comparison.png")
    assert (tmp_path / "comparison.png").stat().st_size > 0


def test_paired_difference_closed_form_and_errors():
    # differences 1, 0, 0, −1: mean 0, sample variance 2/3, SE √(2/3 / 4)
    assert paired_difference([1, 1, 0, 0], [0, 1, 0, 1]) == pytest.approx((0.0, (2 / 3 / 4) ** 0.5, 4))
    # the same model twice: no difference, no uncertainty — unlike the unpaired SEs of the two accuracies
    assert paired_difference([1, 0, 1], [1, 0, 1]) == (0.0, 0.0, 3)
    with pytest.raises(ValueError, match="same examples"):
        paired_difference([1, 0], [1, 0, 1])


def test_token_counts_keep_their_unit():
    # the untrained Performer sees 1024 tokens; the full recipe 800 × 2 × 512 = 819 200, 1.6M for 1600 steps
    assert [_fmt_tokens(n) for n in (None, 0, 512, 1024, 819_200, 1_638_400)] == [
        "–",
        "–",
        "512",
        "1.0k",
        "819.2k",
        "1.64M",
    ]


def test_collect_pairs_every_method_with_fix_on_the_same_examples(tmp_path):
    runner = Comparison(out=tmp_path)
    fix_hits, dof_hits = [1, 0, 0, 1, 0, 1], [1, 1, 0, 1, 1, 1]
    for row, hits in (("fix", fix_hits), ("dof", dof_hits), ("performer", [0] * 6)):
        folder = tmp_path / "C64" / row / "eval"
        folder.mkdir(parents=True)
        entry = {"acc": sum(hits) / 6, "acc_norm": sum(hits) / 6, "n": 6, "items": {"acc_norm": hits, "acc": hits}}
        (folder / "arc_easy.json").write_text(json.dumps(entry))
        (folder / "piqa.json").write_text(json.dumps({"acc": 0.5, "acc_norm": 0.5, "n": 6}))  # no per-example scores
    (tmp_path / "C64" / "dof_clip" / "runs").mkdir(parents=True)  # a fit under way: no fit.json, no scores yet
    rows = [ROWS[name] for name in ("fix", "dof", "performer", "dof_clip", "dijiang")]
    report = collect_json(runner, rows, [64])
    cells = {c["row"]: c for c in report["cells"]}
    assert set(cells) == {"fix", "dof", "performer"}  # pending cells are listed under the table, not as empty rows
    assert report["pending"] == ["dof_clip (fit unfinished: it resumes from its last checkpoint)", "dijiang"]
    assert "Not measured yet (re-running the command resumes here): dof_clip (fit unfinished" in markdown(
        Report.from_json(report)
    )
    assert not cells["fix"]["vs_reference"] and cells["fix"]["reference"] is None
    difference, stderr, n = paired_difference(dof_hits, fix_hits)
    assert cells["dof"]["reference"] == "fix"
    assert cells["dof"]["vs_reference"] == {"arc_easy": {"difference": difference, "stderr": stderr, "n": 6}}
    assert difference == pytest.approx(2 / 6)
    table = paired_table(Report.from_json({"tasks": ["piqa", "arc_easy"], "cells": list(cells.values())}))
    assert "| dof | fix | 64 | +33.3 ± 21.1 | – |" in table  # SE of diffs (0,1,0,0,1,0): √(4/15 / 6) = 0.211
    assert "| performer | fix | 64 | -50.0 ± 22.4 | – |" in table
    assert cells["dof"]["vs_reference_average"] is None  # piqa is not paired: no average difference

    # with every task paired, the average difference: mean of the tasks', SE √(Σ SE²) / n (disjoint examples)
    fix_wsc, dof_wsc = [1, 1, 0, 0], [0, 1, 0, 0]
    for row, hits in (("fix", fix_wsc), ("dof", dof_wsc), ("performer", [0] * 4)):
        entry = {"acc": sum(hits) / 4, "n": 4, "items": {"acc": hits}}
        (tmp_path / "C64" / row / "eval" / "wsc273.json").write_text(json.dumps(entry))
    report = collect_json(runner, rows, [64], tasks=["arc_easy", "wsc273"])
    dof = next(c for c in report["cells"] if c["row"] == "dof")
    wsc = paired_difference(dof_wsc, fix_wsc)
    assert dof["vs_reference_average"]["difference"] == pytest.approx((difference + wsc[0]) / 2)  # (1/3 − 1/4) / 2
    assert dof["vs_reference_average"]["stderr"] == pytest.approx((stderr**2 + wsc[1] ** 2) ** 0.5 / 2)
    assert f"| {100 * dof['vs_reference_average']['difference']:+.1f} ± " in paired_table(Report.from_json(report))[-2]


def test_l2_rows_are_paired_with_fix_trained_with_the_same_loss(tmp_path):
    """DoF − Fix isolates the allocation only at the same loss: DoF-L2 and DoF+clip-L2 are measured against
    Fix-L2, and Fix-L2 against Fix (the loss's effect); no pairing where the reference is not measured."""
    runner = Comparison(out=tmp_path)
    hits = {"fix": [1, 0, 0, 1], "fix_l2": [0, 0, 1, 1], "dof_l2": [1, 0, 1, 1], "dof_clip_l2": [0, 0, 0, 1]}
    for row, values in hits.items():
        folder = tmp_path / "C64" / row / "eval"
        folder.mkdir(parents=True)
        (folder / "wsc273.json").write_text(json.dumps({"acc": sum(values) / 4, "n": 4, "items": {"acc": values}}))
    rows = [ROWS[name] for name in hits]
    cells = {c["row"]: c for c in collect_json(runner, rows, [64], tasks=["wsc273"])["cells"]}
    for row, reference in (("fix_l2", "fix"), ("dof_l2", "fix_l2"), ("dof_clip_l2", "fix_l2")):
        expected = paired_difference(hits[row], hits[reference])
        assert cells[row]["reference"] == reference
        assert cells[row]["vs_reference_average"]["difference"] == pytest.approx(expected[0]), row
    table = paired_table(Report.from_json({"tasks": ["wsc273"], "cells": list(cells.values())}))
    assert "| dof_l2 | fix_l2 | 64 | +25.0 ± 25.0 | +25.0 ± 25.0 |" in table  # diffs (1,0,0,0): SE √(1/4 / 4)
    without = collect_json(runner, [ROWS["fix"], ROWS["dof_l2"]], [64], tasks=["wsc273"])
    assert not next(c for c in without["cells"] if c["row"] == "dof_l2")["vs_reference"]  # not against softmax Fix


def test_the_device_reaches_every_stage_and_every_record_names_it(tmp_path):
    with pytest.raises(DeviceError, match="use auto, cpu, cuda or cuda:N"):
        Comparison(out=tmp_path, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device: use --device cpu"):
            Comparison(out=tmp_path, device="cuda")
    runner = Comparison(out=tmp_path, device="auto", fit_args=("--trainer.max_steps=5",))
    assert runner.device == ("cuda" if torch.cuda.is_available() else "cpu")
    runner.device = "cpu"
    assert "--trainer.accelerator=gpu" not in runner.fit_command(ROWS["fix"], 64, resume=False)
    runner.device = "cuda:1"  # a CUDA fit asks the Trainer for that GPU, before fit_args (which may override it)
    command = runner.fit_command(ROWS["fix"], 64, resume=False)
    gpu = command.index("--trainer.accelerator=gpu")
    assert command[gpu + 1] == "--trainer.devices=[1]" and command.index("--trainer.max_steps=5") > gpu + 1

    # the report names the devices: one line when every cell shares them, per cell when they differ;
    # evaluations recorded before `device` was kept say only that CUDA was unavailable, i.e. the CPU
    for row, provenance in (("fix", {"cuda": False, "cpu_threads": 2}), ("dof", {"device": "cuda (NVIDIA H100)"})):
        (tmp_path / "C64" / row / "eval").mkdir(parents=True)
        entry = {"acc": 0.5, "acc_norm": 0.5, "n": 2, "provenance": provenance}
        (tmp_path / "C64" / row / "eval" / "piqa.json").write_text(json.dumps(entry))
    (tmp_path / "C64" / "dof" / "ppl.json").write_text(
        json.dumps({"ppl": 9.0, "tokens": 9, "window": 4, "stride": 2, "device": "cpu"})
    )
    rows = [ROWS["fix"], ROWS["dof"]]
    report = collect_json(runner, rows, [64], tasks=["piqa"])
    assert [c["devices"] for c in report["cells"]] == [["cpu"], ["cpu", "cuda (NVIDIA H100)"]]
    assert "Devices: fix: cpu; dof: cpu and cuda (NVIDIA H100)." in markdown(Report.from_json(report))
    report = collect_json(runner, rows[:1], [64], tasks=["piqa"])
    assert "Device: cpu (every cell)." in markdown(Report.from_json(report))


def test_seeds_are_paired_within_a_seed_and_summarised_over_seeds(tmp_path):
    """Each seed's DoF is paired with the same seed's Fix; the summary's standard error over seeds is
    sd/√n of those per-seed differences (closed form below), not any single run's paired SE."""
    runner = Comparison(out=tmp_path)
    hits = {  # (row, seed): per-example wsc273 scores
        ("fix", 0): [1, 0, 0, 1],
        ("dof", 0): [1, 1, 0, 1],  # +1/4
        ("fix", 1): [1, 1, 0, 1],
        ("dof", 1): [1, 1, 0, 1],  # 0
        ("fix", 2): [0, 0, 0, 1],
        ("dof", 2): [1, 1, 1, 1],  # +3/4
    }
    for (row, seed), values in hits.items():
        folder = tmp_path / "C64" / (f"seed{seed}" if seed else "") / row / "eval"
        folder.mkdir(parents=True)
        (folder / "wsc273.json").write_text(json.dumps({"acc": sum(values) / 4, "n": 4, "items": {"acc": values}}))
        (folder.parent / "ppl.json").write_text(
            json.dumps({"ppl": 100.0 + 10 * seed + (row == "dof"), "tokens": 8, "window": 4, "stride": 2})
        )
    rows = [ROWS["fix"], ROWS["dof"]]
    report = collect_json(runner, rows, [64], tasks=["wsc273"], seeds=[0, 1, 2, 3])
    assert report["pending"] == ["fix (seed 3)", "dof (seed 3)"]
    for c in report["cells"]:
        if c["row"] == "dof":
            expected = paired_difference(hits[("dof", c["seed"])], hits[("fix", c["seed"])])
            assert c["vs_reference_average"]["difference"] == pytest.approx(expected[0])
    summary = {s["row"]: s for s in report["seed_summary"]}
    dof = summary["dof"]
    assert dof["seeds"] == [0, 1, 2] and dof["vs_reference_per_seed"] == pytest.approx({"0": 0.25, "1": 0.0, "2": 0.75})
    mean, sd = 1 / 3, ((0.25 - 1 / 3) ** 2 + (1 / 3) ** 2 + (0.75 - 1 / 3) ** 2) ** 0.5 / 2**0.5
    assert dof["vs_reference"]["mean"] == pytest.approx(mean)
    assert dof["vs_reference"]["stderr"] == pytest.approx(sd / 3**0.5)
    assert dof["average"]["mean"] == pytest.approx((0.75 + 0.75 + 1.0) / 3)
    assert dof["ppl"]["mean"] == pytest.approx(111.0) and dof["ppl"]["sd"] == pytest.approx(10.0)
    assert summary["fix"]["vs_reference"] is None  # the reference row has no difference from itself
    table = "\n".join(seed_table(Report.from_json(report)))
    ratios = {str(seed): (101.0 + 10 * seed) / (100.0 + 10 * seed) for seed in (0, 1, 2)}  # DoF's / Fix's ppl
    assert dof["ppl_ratio_per_seed"] == pytest.approx(ratios)
    ratio_sd = statistics.stdev(ratios.values())
    assert dof["ppl_ratio"]["mean"] == pytest.approx(statistics.mean(ratios.values()))
    assert dof["ppl_ratio"]["stderr"] == pytest.approx(ratio_sd / 3**0.5)
    assert (
        f"| dof | fix | 64 | 0, 1, 2 | 0.833 ± 0.144 | 111.0 ± 10.0 | 1.010 (s0), 1.009 (s1), 1.008 (s2) | "
        f"1.009 ± {ratio_sd / 3**0.5:.3f} (n=3) | +25.0 (s0), +0.0 (s1), +75.0 (s2) | "
        f"+33.3 ± {100 * sd / 3**0.5:.1f} (n=3) |" in table
    )
    ppl_only = {**report, "cells": [{**c, "scores": {}} for c in report["cells"]]}  # a perplexity-only study
    assert "| dof | fix | 64 | 0, 1, 2 | 111.0 ± 10.0 | 1.010 (s0), 1.009 (s1), 1.008 (s2) | 1.009 ± " in "\n".join(
        seed_table(Report.from_json(ppl_only))
    )
    assert "| dof (seed 2) | 1.000 | 1.000 |" in markdown(Report.from_json(report))  # one line per seed: wsc273, avg
    panel = {line.get_label(): list(zip(*line.get_data())) for line in figure(Report.from_json(report)).axes[0].lines}
    assert panel["dof"] == [(0, pytest.approx(0.8333333))]  # one point per budget: the mean over the seeds
    with pytest.raises(ValueError, match="seed -1: use an integer ≥ 0"):
        Comparison(out=tmp_path, seed=-1)
    single = collect_json(runner, rows, [64], tasks=["wsc273"])
    assert single["seed_summary"] == [] and seed_table(Report.from_json(single)) == []


def test_a_rerender_carries_cells_whose_run_directories_are_gone(tmp_path):
    """The report is the durable record: after the run folder is lost, re-rendering keeps every cell (marked
    carried) and a newly measured row is still paired, on the same examples, with a carried reference."""
    runs, report_dir = tmp_path / "runs", tmp_path / "report"
    runner = Comparison(out=runs)
    hits = {"performer": [0, 0, 1, 0], "fix": [1, 0, 0, 1], "dof": [1, 1, 0, 1], "dijiang": [0, 1, 1, 1]}

    def measure(row):
        folder = runs / "C64" / row / "eval"
        folder.mkdir(parents=True)
        (folder / "wsc273.json").write_text(
            json.dumps({"acc": sum(hits[row]) / 4, "n": 4, "items": {"acc": hits[row]}})
        )
        (folder.parent / "ppl.json").write_text(
            json.dumps({"ppl": 10.0 + len(row), "tokens": 8, "window": 4, "stride": 2})
        )

    for row in ("performer", "fix", "dof"):
        measure(row)
    rows = [ROWS[name] for name in ("performer", "fix", "dof", "dijiang")]
    first = write_report(runner, rows, [64], report_dir)
    assert first.pending == ["dijiang"] and first.carried == []
    stored = json.loads((report_dir / "comparison.json").read_text())
    assert {c["row"]: c["items"] for c in stored["cells"]}["dof"] == {"wsc273": "1101"}  # one byte per example

    import shutil

    shutil.rmtree(runs)  # the scratch folder is lost; DiJiang is measured afterwards
    measure("dijiang")
    second = collect_json(runner, rows, [64], tasks=["wsc273"], previous=stored)
    cells = {c["row"]: c for c in second["cells"]}
    assert second["carried"] == ["performer", "fix", "dof"] and second["pending"] == []
    assert cells["dof"]["carried"] and not cells["dijiang"]["carried"]
    for row in ("dof", "dijiang"):  # recomputed from the stored items, not copied
        expected = paired_difference(hits[row], hits["fix"])
        assert cells[row]["vs_reference"]["wsc273"]["difference"] == pytest.approx(expected[0]), row
        assert cells[row]["vs_reference"]["wsc273"]["stderr"] == pytest.approx(expected[1]), row
    assert cells["dijiang"]["gap_closed"] is None  # no teacher among the rows: no gap
    assert cells["dof"]["ppl"] == 13.0 and cells["dof"]["scores"]["wsc273"]["value"] == 0.75
    text = markdown(Report.from_json(second))
    assert "Carried from this folder's earlier comparison.json" in text and ": performer, fix, dof." in text

    # a second rewrite from the first carried report (every run folder gone now) keeps the per-example scores
    # and recomputes the same pairings from them
    shutil.rmtree(runs)
    third = collect_json(runner, rows, [64], tasks=["wsc273"], previous=json.loads(json.dumps(second)))
    again = {c["row"]: c for c in third["cells"]}
    assert third["carried"] == ["performer", "fix", "dof", "dijiang"]
    assert {row: again[row]["items"] for row in hits} == {row: {"wsc273": "".join(map(str, hits[row]))} for row in hits}
    for row in ("dof", "dijiang"):
        assert again[row]["vs_reference"] == cells[row]["vs_reference"], row

    # a report from before items were kept: the earlier pairing stands while the reference is carried too,
    # and is dropped when the reference was measured again (different measurements)
    legacy = {**stored, "cells": [{k: v for k, v in c.items() if k != "items"} for c in stored["cells"]]}
    kept = collect_json(Comparison(out=tmp_path / "none"), rows[:3], [64], tasks=["wsc273"], previous=legacy)
    dof = next(c for c in kept["cells"] if c["row"] == "dof")
    assert dof["vs_reference"] == next(c for c in stored["cells"] if c["row"] == "dof")["vs_reference"]
    measure("fix")
    remeasured = collect_json(runner, rows[:3], [64], tasks=["wsc273"], previous=legacy)
    assert not next(c for c in remeasured["cells"] if c["row"] == "dof").get("vs_reference")
    assert paired_table(Report.from_json(remeasured))[-1].endswith(": performer vs fix (C = 64), dof vs fix (C = 64).")
    assert collect_json(runner, rows[:3], [64], tasks=["wsc273"])["pending"] == ["performer", "dof"]

    (report_dir / "comparison.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a comparison report .* pass --carry false"):
        write_report(runner, rows, [64], report_dir)
    assert write_report(runner, rows, [64], report_dir, carry=False).carried == []


def test_long_stage_measures_perplexity_by_position_at_every_context(tmp_path):
    """``long.json``: one position-perplexity result per context, each equal to a direct
    :func:`position_perplexity` over the same stream of test documents (the default split); a second call reads the
    file back, and one asking for the validation split refuses it by name."""
    from lit_dof.data.sources import split_documents
    from lit_dof.evaluation.cli import load_model
    from lit_dof.evaluation.perplexity import text_tokens
    from lit_dof.evaluation.position_perplexity import position_perplexity

    runner = Comparison(out=tmp_path, teacher=str(TINYSTORIES), corpus=str(WIKIPEDIA), ppl_tokens=192,
                                   long_contexts=(32, 64), device="cpu")  # fmt: skip  # packed args
    result = runner.long_context(ROWS["teacher"], 16)
    assert set(result["contexts"]) == {"32", "64"}
    assert list(result["contexts"]["64"]["buckets"]) == ["0-63"] and result["contexts"]["64"]["blocks"] == 3
    assert list(result["contexts"]["32"]["buckets"]) == ["0-31"] and result["contexts"]["32"]["blocks"] == 6
    model, tokenizer = load_model(str(TINYSTORIES))
    tokens = text_tokens(split_documents(WIKIPEDIA, "test"), tokenizer, 192)
    direct = position_perplexity(model, tokens, block=64, edges=(0, 64))
    assert result["contexts"]["64"]["ppl"] == pytest.approx(direct["ppl"], rel=1e-6) and result["split"] == "test"
    assert runner.long_context(ROWS["teacher"], 16) == result  # resumable: read back, not recomputed
    with pytest.raises(ValueError, match="long.json measured the test split, not the validation split"):
        replace(runner, ppl_split="validation").long_context(ROWS["teacher"], 16)


def test_compare_prints_each_cell_with_elapsed_time_and_eta_on_stderr(tmp_path, capsys):
    run_compare(rows=["teacher", "fix"], budgets=[16], out=str(tmp_path), stages=[], carry=False, device="cpu")
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("[compare]")]
    assert lines[0].startswith("[compare] cell 1/2 C=16 teacher () · elapsed 0:00:0") and lines[0].endswith("ETA –")
    assert lines[1].startswith("[compare] cell 2/2 C=16 fix () · elapsed")
    assert lines[2].startswith("[compare] cell 2/2 done: every cell; writing the report")
    assert "[compare]" not in captured.out


def test_fit_commands_give_the_budget_and_seed_to_the_rows_planner(tmp_path):
    """A DoF row's budget and sample seed go to its DoFPlanner (``budget``, ``seed``); a FixedPlanner row (the
    window-only controls) gets the budget as its ``feature_dim`` and no DoF settings, which it would refuse, and no
    ``report_path`` on resume (it writes no dof.json)."""
    runner = Comparison(out=tmp_path, seed=2, corpus=str(tmp_path / "corpus.txt"))
    dof = runner.fit_command(ROWS["dof"], 16, resume=True, dof_report=tmp_path / "dof.json")
    report_path = f"{PLANNER_ARGS}.report_path={tmp_path / 'dof.json'}"
    seeded = {"--seed_everything=2", "--data.init_args.shuffle_seed=2"}
    assert {f"{PLANNER_ARGS}.budget=16", f"{PLANNER_ARGS}.seed=2", report_path, *seeded} <= set(dof)
    control = runner.fit_command(ROWS["swa_sink"], 16, resume=True, dof_report=tmp_path / "dof.json")
    assert f"{PLANNER_ARGS}.feature_dim=16" in control and seeded <= set(control)
    assert not [arg for arg in control if arg.startswith(PLANNER_ARGS) and "feature_dim" not in arg]
    configs = [REPO / "configs" / name for name in ("base.yaml", "methods/swa_sink.yaml", "methods/fix.yaml")]
    assert planner_class(configs[:1]) == "lit_dof.pipeline.planner.DoFPlanner"
    assert planner_class(configs[:2]) == "lit_dof.pipeline.planner.FixedPlanner"
    assert planner_class(configs) == "lit_dof.pipeline.planner.DoFPlanner"  # the last class named
    assert planner_class(configs[:1], ["--model.init_args.planner=FixedPlanner"]) == "FixedPlanner"
    assert planner_class([tmp_path / "missing.yaml"]) == "lit_dof.pipeline.planner.DoFPlanner"  # the default


def test_every_row_names_config_files_that_exist_and_a_reference_row():
    from lit_dof.comparison.rows import REPO_CONFIGS

    for row in ROWS.values():
        missing = [name for name in row.configs if not (REPO_CONFIGS / name).is_file()]
        assert not missing, f"row {row.name}: {missing} not under {REPO_CONFIGS}"
        assert row.kind == "teacher" or row.reference in ROWS, row.name
    assert {"lolcats", "lora", "dof_head", "swa_linear", "swa_only", "swa_sink"} <= set(ROWS)  # issue 25's recipes


def test_the_command_options_are_the_comparisons_fields_and_the_grids():
    import inspect
    from pathlib import Path

    from lit_dof.comparison.cli import SKIPPED
    from lit_dof.help_text import command_parser

    parser = command_parser(compare, "lit-dof compare", flat=["comparison"], skip=SKIPPED, as_positional=False)
    options = {action.dest.split(".")[0] for action in parser._actions} - {"help", "config", "print_config"}
    grid = set(inspect.signature(compare).parameters) - {"comparison"}
    assert options == grid | ({f.name for f in fields(Comparison)} - set(SKIPPED))
    defaults = parser.get_defaults()
    assert (defaults.out, defaults.eval_batch_size, defaults.mmlu_per_subject) == (Path("runs/compare"), 16, 18)
