"""``SlidingWindow``: validated once, round-trips through a student's config, and reads older config files."""

from __future__ import annotations

import pytest

from lit_dof.attention import SlidingWindow
from lit_dof.students.config import LitDofConfig
from tests.conftest import tiny_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"window": -1}, "window must be an integer >= 0"),
        ({"window": 4, "sink_tokens": 1.5}, "sink_tokens must be an integer >= 0"),
        ({"window": 4, "far_decay": 0}, "far_decay must be a positive"),
        ({"window": 4, "learn_decay": True}, "learn_decay needs far_decay"),
        ({"sink_tokens": 2}, r"\['sink_tokens'\] need a sliding window"),
        ({"far_term": False, "far_decay": 8.0}, r"\['far_term', 'far_decay'\] need a sliding window"),
        # the quickstart's far-term options inherited by a pure linear method file: the error names the reset
        ({"far_decay": 128, "far_rope": False}, r"\['far_decay', 'far_rope'\] .*pure linear method over configs/base"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SlidingWindow(**kwargs)


def test_default_is_pure_linear_attention():
    assert not SlidingWindow().enabled and SlidingWindow(window=1).enabled


def test_config_round_trip_and_older_flat_keys(tmp_path):
    options = SlidingWindow(window=8, sink_tokens=2, learn_mix=False, far_decay=32.0, learn_decay=True)
    text_config = tiny_model("llama").config
    config = LitDofConfig(text_config=text_config, feature_dims=[4, 4], window_options=options)
    config.save_pretrained(tmp_path / "new")
    assert SlidingWindow.from_dict(LitDofConfig.from_pretrained(tmp_path / "new").window_options) == options
    # a config.json written before the options were one value: the six fields at the top level
    flat = LitDofConfig(text_config=text_config, feature_dims=[4, 4], **options.to_dict())
    assert SlidingWindow.from_dict(flat.window_options) == options
    assert not hasattr(flat, "window") and not hasattr(flat, "sliding_window")
