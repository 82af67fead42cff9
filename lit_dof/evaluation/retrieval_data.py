"""Where retrieval examples sit and which tasks there are: the grid of contexts × needle depths × trials
(:class:`RetrievalGrid`), the tasks by name (:data:`GENERATORS`, :data:`RETRIEVAL_TASKS`) and every example of a
task on a grid (:func:`examples`). The examples themselves — passkey, RULER-style needles, associative recall — are
built in :mod:`lit_dof.evaluation.needles`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from lit_dof.evaluation.needles import (
    ANSWER_TOKENS,
    RetrievalExample,
    assoc_recall,
    niah_multikey,
    niah_multiquery,
    niah_multivalue,
    niah_single,
    niah_uuid,
    passkey,
)

CONTEXTS = (1024, 2048, 4096, 8192)
"""Default context lengths in tokens (prompt + answer budget); those beyond the model's positions are dropped."""

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Default needle depths (0: the needle opens the haystack, 1: it closes it)."""


@dataclass(frozen=True)
class RetrievalGrid:
    """Where the retrieval examples are placed: every (context, depth) cell gets ``trials`` examples.

    Attributes:
        contexts: context lengths in tokens (the prompt plus a 64-token answer budget); those beyond the model's
            positions are dropped.
        depths: needle depths in [0, 1].
        trials: examples per cell.
        seed: the task seed (other seeds: other keys, values and distractor depths).

    Raises:
        ValueError: no context, a context under 2 × the answer budget, a depth outside [0, 1], ``trials`` < 1.
    """

    contexts: tuple[int, ...] = CONTEXTS
    depths: tuple[float, ...] = DEPTHS
    trials: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.contexts or any(not isinstance(c, int) or c < 2 * ANSWER_TOKENS for c in self.contexts):
            raise ValueError(f"retrieval.contexts must be token counts >= {2 * ANSWER_TOKENS}, got {self.contexts!r}")
        if not self.depths or any(not 0.0 <= float(d) <= 1.0 for d in self.depths):
            raise ValueError(f"retrieval.depths must lie in [0, 1], got {self.depths!r}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"retrieval.trials must be an integer >= 1, got {self.trials!r}")

    def settings(self) -> dict:
        """The grid as a record's provenance holds it: ``{"contexts": [...], "depths": [...], "trials", "seed"}``."""
        return {"contexts": list(self.contexts), "depths": list(self.depths), "trials": self.trials, "seed": self.seed}

    def metadata(self) -> dict:
        """The grid as lm-eval task metadata (``retrieval_contexts``, …; read by the task hooks)."""
        return {
            "retrieval_contexts": list(self.contexts),
            "retrieval_depths": list(self.depths),
            "retrieval_trials": self.trials,
            "retrieval_seed": self.seed,
        }


GENERATORS: dict[str, Callable[..., RetrievalExample]] = {
    "passkey": passkey,
    "niah_single": niah_single,
    "niah_uuid": niah_uuid,
    "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue,
    "niah_multiquery": niah_multiquery,
    "assoc_recall": assoc_recall,
}
"""The retrieval tasks by name (each scored by greedy generation: the lm-eval task ``lit_dof_<name>``)."""

LOGLIKELIHOOD_TASKS = ("passkey", "niah_single", "niah_uuid", "niah_multikey", "assoc_recall")
"""The single-answer tasks also scored by the answer's log-likelihood (``lit_dof_<name>_ll``)."""

RETRIEVAL_TASKS = (*GENERATORS, *(f"{name}_ll" for name in LOGLIKELIHOOD_TASKS))
"""Every retrieval task name ``lit-dof eval --tasks`` accepts."""


def examples(
    task: str,
    tokenizer,
    *,
    contexts: Sequence[int] = CONTEXTS,
    depths: Sequence[float] = DEPTHS,
    trials: int = 4,
    seed: int = 0,
    max_length: int | None = None,
) -> list[RetrievalExample]:
    """Every example of ``task``: trial-major (trial 0 of every cell first, so an evaluation ``limit`` of
    k × cells keeps k trials of each cell), then context, then depth.

    Args:
        task: a name of :data:`GENERATORS`.
        tokenizer: the model's tokenizer.
        contexts: context lengths in tokens; those above ``max_length`` are dropped.
        depths: needle depths in [0, 1].
        trials: examples per (context, depth) cell.
        seed: the task seed.
        max_length: the model's positions (``None``: no limit).

    Returns:
        the examples.

    Raises:
        ValueError: an unknown task, a depth outside [0, 1], no context within ``max_length``.
    """
    if task not in GENERATORS:
        raise ValueError(f"unknown retrieval task {task!r}; known: {', '.join(GENERATORS)}")
    if any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"retrieval depths must lie in [0, 1], got {list(depths)}")
    kept = [c for c in contexts if max_length is None or c <= max_length]
    if not kept:
        raise ValueError(f"no retrieval context within the model's {max_length} positions: got {list(contexts)}")
    make = GENERATORS[task]
    try:
        return [make(tokenizer, c, d, trial=t, seed=seed) for t in range(trials) for c in kept for d in depths]
    except ValueError as exc:
        raise ValueError(f"retrieval task {task}: {exc}; use longer contexts (retrieval.contexts)") from exc
