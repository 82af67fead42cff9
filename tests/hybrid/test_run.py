"""The search's settings: defaults of the held-out comparison, validation, the recorded settings."""

from __future__ import annotations

import pytest

from lit_dof.hybrid.orderings import ORDERINGS, default_counts
from lit_dof.hybrid.run import HybridSearch


def test_default_counts():
    assert default_counts(8, 30) == [2, 4, 6, 8]
    assert default_counts(0, 30) == [1, 2, 3, 4]
    assert default_counts(3, 3) == [1, 2, 3]


def test_settings_are_validated_at_once_and_recorded_by_metric():
    with pytest.raises(ValueError, match="metric"):
        HybridSearch(metric="bleu")
    with pytest.raises(ValueError, match="shortlist"):
        HybridSearch(shortlist="random")
    with pytest.raises(ValueError, match="unknown orderings"):
        HybridSearch(orderings=["greedy", "best"])
    assert HybridSearch().orderings == list(ORDERINGS) and HybridSearch().orderings is not HybridSearch().orderings
    accuracy = HybridSearch(corpus="wiki.txt").settings
    assert accuracy.task == "arc_easy" and accuracy.corpus is None
    ppl = HybridSearch(metric="perplexity", corpus="wiki.txt").settings
    assert ppl.task is None and ppl.corpus == "wiki.txt"


def test_device_and_dtype_are_validated_at_once_and_dtype_recorded_unless_auto():
    from lit_dof.devices import DeviceError

    with pytest.raises(DeviceError, match="use auto, cpu, cuda or cuda:N"):
        HybridSearch(device="gpu")
    with pytest.raises(DeviceError, match="dtype 'half'"):
        HybridSearch(dtype="half")
    assert HybridSearch().settings.dtype is None  # as in records written before the option: they resume
    assert HybridSearch(dtype="bfloat16", device="cpu").settings.dtype == "bfloat16"


def test_the_command_options_are_the_settings_fields():
    from dataclasses import fields

    from lit_dof.help_text import command_parser
    from lit_dof.hybrid.cli import search
    from lit_dof.hybrid.settings import SearchSettings

    parser = command_parser(search, "lit-dof hybrid", flat=["settings"])
    options = {action.dest for action in parser._actions} - {"help", "config", "print_config"}
    assert options == {f.name for f in fields(SearchSettings)}
