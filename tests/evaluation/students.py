"""A tiny exported student for the evaluation tests: the TinyStories teacher behind a sliding window + sinks with
an untrained linear far term, saved with its tokenizer."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TINYSTORIES


def save_window_student(
    folder: Path,
    window: int = 16,
    sink_tokens: int = 2,
    feature_dim: int = 8,
    softmax_layers: tuple[int, ...] = (),
    exact_heads: dict[int, list[int]] | None = None,
) -> Path:
    """Linearise the TinyStories teacher (window + sinks + far term, seed 0) and save it with its tokenizer.

    Args:
        folder: the student folder to write.
        window: w, tokens attended exactly.
        sink_tokens: s, first tokens attended exactly.
        feature_dim: M of every layer's far term.
        softmax_layers: layers kept with the teacher's full softmax attention.
        exact_heads: ``{layer: [KV head, …]}`` kept exact inside linear layers.

    Returns:
        ``folder``.
    """
    from lit_dof.attention import LearnedPRF, SlidingWindow
    from lit_dof.students.modeling import linearize
    from lit_dof.teacher.loading import load_teacher

    teacher, tokenizer = load_teacher(str(TINYSTORIES))
    options = SlidingWindow(window=window, sink_tokens=sink_tokens)
    student = linearize(
        teacher,
        LearnedPRF,
        feature_dim,
        sliding_window=options,
        softmax_layers=softmax_layers,
        seed=0,
        exact_heads=exact_heads,
    )
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
