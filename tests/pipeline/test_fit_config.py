"""What the tools read of a fit config (FitConfig): the shipped quickstart's teacher, planner and batch shape, the
strategy of every way a config can name its planner, and a value of the wrong type refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lit_dof.config_files import config_path
from lit_dof.pipeline.fit_config import FitConfig, named_planner
from lit_dof.records import parse_record


def test_the_quickstart_config_as_the_tools_read_it():
    import yaml

    raw = yaml.safe_load(config_path("quickstart.yaml").read_text())
    config = FitConfig.load(config_path("quickstart.yaml"))
    data = raw["data"]["init_args"]
    assert config.teacher == raw["model"]["init_args"]["teacher"]
    assert config.tokens_per_step == data["batch_size"] * data["seq_len"]
    assert config.trainer.max_steps == raw["trainer"]["max_steps"]
    assert config.planner_class == raw["model"]["init_args"]["planner"]["class_path"] and config.strategy == "dof"


@pytest.mark.parametrize(
    "model, allocator, strategy",
    [
        ({"planner": {"class_path": "lit_dof.pipeline.planner.FixedPlanner"}}, None, "fix"),
        ({"planner": {"class_path": "DoFPlanner", "init_args": {"strategy": "dof_clip"}}}, None, "dof_clip"),
        ({"planner": {"init_args": {"strategy": "dof_head"}}}, None, "dof_head"),  # class kept from an earlier file
        ({}, {"strategy": "dof"}, "dof"),  # a config from before the planners
        ({}, None, None),
    ],
)
def test_the_strategy_of_each_way_to_name_a_planner(model, allocator, strategy):
    config = parse_record(FitConfig, {"model": {"init_args": model}, "allocator": allocator})
    assert config.strategy == strategy and config.tokens_per_step is None


def test_planner_values_and_bad_types():
    assert named_planner("FixedPlanner") == "FixedPlanner" and named_planner(None) is None
    assert named_planner({"class_path": "a.B", "init_args": {}}) == "a.B" and named_planner({"init_args": {}}) is None
    with pytest.raises(ValidationError, match="max_steps"):
        parse_record(FitConfig, {"trainer": {"max_steps": "many"}})
