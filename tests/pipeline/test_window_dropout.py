"""Window dropout (``model.init_args.window_dropout``): the cut steps are a seeded share of the layer-wise steps
(the same after a resume), every sliding-window twin — per-head groups included — attends exactly to the cut
window inside the loss and gets its own back afterwards (also after an error), the end-to-end tail is never cut,
and a fit exports the student's own window."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_dof.attention import LearnedPRF, SlidingWindow
from lit_dof.pipeline.cli import build_cli
from lit_dof.pipeline.layerwise import LayerwiseDistillation
from lit_dof.pipeline.window_dropout import WindowDropout
from lit_dof.students import linearize, load_student
from tests.conftest import tiny_model
from tests.pipeline.conftest import fit_args


def test_cut_steps_are_a_seeded_share_of_the_steps():
    dropout = WindowDropout(rate=0.3, window=2, seed=5)
    draws = [dropout.cuts(step, 0) for step in range(2000)]
    assert draws == [WindowDropout(rate=0.3, window=2, seed=5).cuts(step, 0) for step in range(2000)]  # a resume
    assert 0.26 < sum(draws) / len(draws) < 0.34
    assert draws != [WindowDropout(rate=0.3, seed=6).cuts(step, 0) for step in range(2000)]
    assert not any(WindowDropout(rate=0).cuts(s, 0) for s in range(100))
    assert all(WindowDropout(rate=1).cuts(s, 0) for s in range(100))
    with pytest.raises(ValueError, match="rate must be a probability"):
        WindowDropout(rate=1.5)
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        WindowDropout(window=0)


def test_every_twin_is_cut_inside_and_restored_after_even_on_error():
    student = linearize(
        tiny_model("llama"), LearnedPRF, [[4, 8], 6, 8], sliding_window=SlidingWindow(window=6, sink_tokens=2)
    )
    twins = student.linear_modules().values()
    layers = [layer for twin in twins for layer in getattr(twin, "groups", [twin])]
    with WindowDropout(rate=1, window=2).applied(twins, step=0, batch_idx=0) as cut:
        assert cut and {(layer.window, layer.sink_tokens) for layer in layers} == {(2, 2)}
    assert {(layer.window, layer.sink_tokens) for layer in layers} == {(6, 2)}
    with pytest.raises(RuntimeError, match="boom"):
        with WindowDropout(rate=1, window=2).applied(twins, step=0, batch_idx=0):
            raise RuntimeError("boom")
    assert {layer.window for layer in layers} == {6}


def test_a_fit_cuts_the_layerwise_steps_only_and_exports_its_own_window(tmp_path, monkeypatch):
    seen = []  # (global step, in the tail, the twins' windows) at every layer loss
    original = LayerwiseDistillation._each_layer_loss

    def spy(self, captured, batch_idx):
        for index, twin, loss in original(self, captured, batch_idx):
            seen.append((self.global_step, self.in_finetune(), twin.window))
            yield index, twin, loss

    monkeypatch.setattr(LayerwiseDistillation, "_each_layer_loss", spy)
    extra = [
        "--model.init_args.sliding_window.window=16",
        "--model.init_args.window_dropout.rate=1",
        "--model.init_args.window_dropout.window=3",
        "--model.init_args.finetune_fraction=0.25",
        "--trainer.log_every_n_steps=1",
    ]
    cli = build_cli(fit_args(tmp_path, "methods/swa_sink_linear.yaml", steps=4, extra=extra))
    assert isinstance(cli.model.window_dropout, WindowDropout) and cli.model.window_dropout.window == 3
    layerwise = {window for _, tail, window in seen if not tail}
    tail = {window for _, in_tail, window in seen if in_tail}
    assert layerwise == {3} and tail == {16}  # cut in every layer-wise step (rate 1), never in the tail
    student = load_student(Path(cli.trainer.log_dir) / "student")
    assert student.config.window_options["window"] == 16
    assert {t.window for t in student.linear_modules().values()} == {16}
