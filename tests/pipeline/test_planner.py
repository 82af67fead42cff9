"""Feature-dimension planners on the real tiny TinyStories teacher: FixedPlanner's uniform dims, DoFPlanner's
estimate on the trainer's batches (Algorithm 1 as lit_dof.dof computes it) and its allocations, the refusals before
the teacher loads, and the callback that writes the plan's dof.json and figures."""

from __future__ import annotations

import json
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lit_dof.attention import SlidingWindow
from lit_dof.dof import DoFReport, collect_samples, dof_report
from lit_dof.pipeline.allocation import AttentionShape
from lit_dof.pipeline.callbacks import PlanFiles
from lit_dof.pipeline.layerwise import LayerwiseDistillation
from lit_dof.pipeline.planner import DoFPlanner, FeatureDimPlan, FixedPlanner, StudentSpec
from lit_dof.pipeline.resume import ResumeMismatchError, check_resume, planner_settings, run_settings, saved_settings
from tests.conftest import TINYSTORIES

SPEC = StudentSpec(str(TINYSTORIES))
BATCHES = [{"input_ids": torch.randint(3, 2000, (2, 32), generator=torch.Generator().manual_seed(i))} for i in range(3)]


@pytest.fixture(scope="module")
def teacher():
    from lit_dof.teacher.loading import load_teacher

    return load_teacher(str(TINYSTORIES))[0]  # 2 layers, 8 heads of 16


def _trainer(batches):
    """What a planner reads of a one-process trainer: its datamodule's training batches, rank, device."""
    datamodule = SimpleNamespace(train_dataloader=lambda: iter(batches))
    strategy = SimpleNamespace(root_device=torch.device("cpu"))
    return SimpleNamespace(datamodule=datamodule, global_rank=0, world_size=1, is_global_zero=True, strategy=strategy)


def test_fixed_planner_gives_every_layer_one_dim(teacher):
    assert FixedPlanner().plan(teacher, None, SPEC) == FeatureDimPlan([16, 16], "fix")  # the head size C
    assert FixedPlanner(6).plan(teacher, None, SPEC) == FeatureDimPlan([6, 6], "fix", None)
    assert FixedPlanner(6).allocation_settings() == {"feature_dim": 6}
    with pytest.raises(ValueError, match="feature_dim must be >= 1"):
        FixedPlanner(0)
    # rounded up to the kernel tile, M kept where it is one already; recorded only when it rounds
    assert FixedPlanner(6, multiple_of=16).plan(teacher, None, SPEC) == FeatureDimPlan([16, 16], "fix")
    assert FixedPlanner(32, multiple_of=16).outlook(AttentionShape.of(teacher)).dims == [32, 32]
    assert FixedPlanner(6, multiple_of=16).allocation_settings() == {"feature_dim": 6, "multiple_of": 16}
    with pytest.raises(ValueError, match="multiple_of must be >= 1"):
        FixedPlanner(multiple_of=0)


def test_dof_planner_estimates_algorithm_1_on_the_trainers_batches_and_allocates_by_strategy(teacher, tmp_path):
    """The first ``num_batches`` training batches (keyed 0, 1, … as the ranks key them), J samples per head, the
    auto λ: the report lit_dof.dof computes from them, and each strategy's dims those of that report's allocation
    (the planner's defaults: min_dim 1, multiple_of 1, budget C)."""
    plan = DoFPlanner(num_samples=32, num_batches=2).plan(teacher, _trainer(BATCHES), SPEC)
    reservoir, tokens = collect_samples(teacher, BATCHES[:2], 32, keys=[0, 1], progress=False)
    expected = dof_report(teacher, reservoir, tokens, "auto", name=str(TINYSTORIES), progress=False)
    assert plan.strategy == "dof" and plan.report.tokens == 2 * 2 * 32
    assert (plan.report.head_dof, plan.report.lam, plan.report.allocations) == (
        expected.head_dof, expected.lam, expected.allocations
    )  # fmt: skip  # one comparison
    assert plan.feature_dims == expected.allocations["dof"] and plan.feature_dims != [16, 16]
    expected.save(tmp_path / "dof.json")
    for strategy in ("dof_clip", "fix", "dof_head"):  # from the saved report: no trainer needed
        planned = DoFPlanner(strategy=strategy, report_path=str(tmp_path / "dof.json")).plan(teacher, None, SPEC)
        assert planned.feature_dims == expected.allocations[strategy] and planned.strategy == strategy
        assert planned.report == DoFReport.load(tmp_path / "dof.json")
    budget = DoFPlanner(strategy="fix", budget=5, report_path=str(tmp_path / "dof.json")).plan(teacher, None, SPEC)
    assert budget.feature_dims == [5, 5] and budget.report is not None  # Fix with the DoF for its report
    with pytest.raises(ValueError, match="needs a trainer with a datamodule"):
        DoFPlanner().plan(teacher, None, SPEC)


def test_bad_planner_settings_are_refused_before_the_teacher_loads(tmp_path):
    """At construction, or by ``check`` at the start of ``configure_model``: the teacher here does not exist, so
    anything but the planner's own error would be a loading error."""
    with pytest.raises(ValueError, match="strategy must be one of"):
        DoFPlanner(strategy="uniform")
    with pytest.raises(ValueError, match="budget"):
        DoFPlanner(budget=0)
    with pytest.raises(ValueError, match="lam='auto'"):
        DoFPlanner(relative_to="trace")
    refusals = [
        (DoFPlanner(far_pairs=True), {}, ValueError, "far_pairs needs a sliding-window student"),
        (DoFPlanner(strategy="dof_head"), {"share_kv_maps": False}, ValueError, "needs share_kv_maps=True"),
        (DoFPlanner(report_path=str(tmp_path / "none.json")), {}, FileNotFoundError, "none.json"),
    ]
    for planner, kwargs, error, message in refusals:
        module = LayerwiseDistillation(teacher=str(tmp_path / "no-teacher"), planner=planner, **kwargs)
        with pytest.raises(error, match=message):
            module.configure_model()
    DoFPlanner(far_pairs=True).check(StudentSpec("t", sliding_window=SlidingWindow(window=16)))  # a window: accepted


def test_resume_compares_the_planner_class_and_its_allocation_settings_only(tmp_path):
    """A checkpoint records the planner's class and allocation settings; how its DoF was estimated may change on
    resume, its allocation may not; a checkpoint from before the planners compares its allocator's settings."""
    saved = run_settings({}, None, planner_settings(DoFPlanner(num_samples=64, seed=1)), None)
    check_resume(tmp_path / "last.ckpt", saved, run_settings({}, None, planner_settings(DoFPlanner(lam=2.0)), None))
    with pytest.raises(ResumeMismatchError, match=r"planner\.class: 'lit_dof\.pipeline\.planner\.DoFPlanner' in the"):
        check_resume(tmp_path / "last.ckpt", saved, run_settings({}, None, planner_settings(FixedPlanner()), None))
    allocator = {"strategy": "dof", "multiple_of": 1, "min_dim": 8, "budget": None}
    legacy = {"hyper_parameters": {"feature_dim": None}, "callbacks": {"FeatureDimAllocator": allocator}}
    current = run_settings({}, None, planner_settings(DoFPlanner(strategy="dof_clip", min_dim=8)), None)
    with pytest.raises(ResumeMismatchError, match=r"planner\.strategy: 'dof' in the checkpoint, 'dof_clip' now"):
        check_resume(tmp_path / "last.ckpt", saved_settings(legacy), current)


def _fit_start(tmp_path, plan: FeatureDimPlan, **kwargs):
    """The run directory after :class:`PlanFiles` saw the start of a fit of a module holding ``plan``."""
    trainer = L.Trainer(logger=CSVLogger(str(tmp_path), name="run", version=0), accelerator="cpu", devices=1)
    module = LayerwiseDistillation(teacher="unused")
    module.plan = plan
    PlanFiles(**kwargs).on_fit_start(trainer, module)
    return tmp_path / "run" / "version_0"


def test_plan_files_write_the_report_and_its_figures(tmp_path):
    report = DoFReport(model="m", model_type="llama", head_size=16, pooling="query_head", lam=0.5, lam_rule="auto",
                       relative_to=None, num_samples=8, tokens=64, head_dof=[[1.0, 2.0], None, [3.0, 4.0]],
                       layer_dof=[2.0, None, 4.0], linearizable=[True, False, True],
                       allocations={"dof": [11, 16, 21]})  # fmt: skip  # packed args
    run = _fit_start(tmp_path / "a", FeatureDimPlan([11, 16, 21], "dof", report))
    assert json.loads((run / "dof.json").read_text()) == report.to_dict()
    assert {p.name for p in (run / "figures").iterdir()} == {"dof_heads.png", "dof_feature_dims.png", "dof_table.md"}
    assert "| 1 | softmax | 16 |" in (run / "figures" / "dof_table.md").read_text()
    run = _fit_start(tmp_path / "b", FeatureDimPlan([[8, 24], 16, 16], "dof_head", report), figures=False)
    assert (run / "dof.json").is_file() and not (run / "figures").exists()
    run = _fit_start(tmp_path / "c", FeatureDimPlan([16, 16, 16], "fix"))  # FixedPlanner: no report, no files
    assert not (run / "dof.json").exists() and not (run / "figures").exists()
