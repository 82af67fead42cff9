"""The shipped rows of ``lit-dof compare`` (configs/compare/rows.yaml) build the fits they name, before a run spends
its earlier cells' CPU time on the way to a row that cannot start."""

from __future__ import annotations

import pytest

from lit_dof.comparison.cells import Comparison
from lit_dof.comparison.rows import ROWS, Row
from lit_dof.pipeline.cli import parse_fit_config
from lit_dof.students.query_rows import StratifiedRows
from tests.conftest import TINYSTORIES, WIKIPEDIA

TRAINED = [row for row in ROWS.values() if row.kind == "student"]


def _fit_config(row: Row, tmp_path):
    """The model and data module of ``row``'s fit as `lit-dof compare` would launch it (seed 1: the seed
    arguments too), instantiated without loading the teacher."""
    runner = Comparison(out=tmp_path, corpus=str(WIKIPEDIA), teacher=str(TINYSTORIES), seed=1)
    command = runner.fit_command(row, 64, resume=False)
    return parse_fit_config(command[command.index("fit") + 1 :])


def test_every_trained_row_builds_the_fit_it_names(tmp_path):
    built = {row.name: _fit_config(row, tmp_path) for row in TRAINED}
    assert len(built) >= 30  # every trained row of the shipped file, not an empty selection
    heads = built["quickstart_heads_gate_dropout"].model
    assert heads.exact_heads.share == 0.2 and heads.sliding_window.far_gate  # the probe: 18 of SmolLM2's 90
    assert heads.window_dropout.rate == 0.25 and heads.window_dropout.window == 16
    long = built["quickstart_heads_feature_decay_long"]
    assert long.model.query_rows == StratifiedRows(count=384, bounds=(256, 512)) and long.data.seq_len == 2048
    assert built["quickstart_retrieval"].model.softmax_layers == [7, 8, 14, 18, 20, 23]
    assert built["quickstart"].data.shuffle["shuffle_seed"] == 1  # the seed's data order reaches the data module


def test_a_row_whose_settings_a_constructor_refuses_fails_here(tmp_path):
    gate = "--model.init_args.sliding_window.far_gate=true"  # on a far term with no decay to start the gate at
    broken = Row(name="gate_without_decay", configs=("methods/swa_sink_linear.yaml",), args=(gate,))
    with pytest.raises(ValueError, match="far_gate needs far_decay"):
        _fit_config(broken, tmp_path)
