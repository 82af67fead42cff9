"""The settings of one hybrid search (``lit-dof hybrid``'s options), declared once: :class:`SearchSettings`, whose
fields are the command's options and the record of what a resumed search must repeat
(:attr:`SearchSettings.settings`). :class:`~lit_dof.hybrid.run.HybridSearch` adds the stages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from lit_dof.devices import resolve_device, resolve_model_dtype
from lit_dof.hybrid.orderings import ORDERINGS
from lit_dof.hybrid.record import RecordedSettings
from lit_dof.hybrid.scoring import METRICS
from lit_dof.precision import DtypeName


@dataclass
class SearchSettings:
    """The settings of a search within ``tolerance`` of the teacher, its exports and the held-out comparison of
    orderings, validated at once.

    Args:
        bank: a student directory whose every layer has a linear twin (``lit-dof fit`` with
            ``configs/hybrid/twins.yaml``).
        task: the target task (one of lit_dof.evaluation.task_data.TASKS), for the accuracy metrics.
        data_dir: folder in the task data layout (docs/usage.md; default ``$LIT_DOF_DATA``).
        metric: ``accuracy`` (lm-eval's acc), ``acc_norm``, ``perplexity`` (on ``corpus``) or ``recall`` (a fact
            recalled from far back in ``corpus``'s held-out text: lit_dof.hybrid.recall_items; for choosing the
            layers that keep softmax attention for retrieval).
        corpus: text corpus for ``perplexity`` and ``recall`` (its held-out documents; WikiExtractor or plain text).
        block: tokens per perplexity block or recall item.
        search_items: items (or blocks) scored per search evaluation.
        heldout_items: items (or blocks) scored per held-out evaluation (the orderings' curves).
        tolerance: the acceptance rule (lit_dof.hybrid.search.Tolerance): a hybrid passes within this of the
            teacher's score (in score units, or as a fraction of it with ``relative``).
        relative: read ``tolerance`` as a fraction of the teacher's score.
        shortlist: rank the remaining layers by ``loss`` (local loss) or ``dof`` and score only the
            ``shortlist_k`` lowest each round; ``None``: every remaining layer.
        shortlist_k: how many layers of the shortlist are scored each round.
        max_linear: stop the greedy search after this many swaps.
        confirm_items: validation items the search does not use (0: off). The search's trajectory is re-scored
            on them from its most linear hybrid down, and the exported ``most_linear`` is the most linear
            one that passes there too: each round keeps the best of several noisy scores, so the search's
            own scores are optimistic (the winner's curse), and this is the check against it.
        verify_items: after everything else, score the teacher and the exported hybrids on this many test
            items (the whole test split when larger; 0: off) without the prefix cache — one precise final
            check of the exports, where ``heldout_items`` is sized for the many scores of the orderings'
            curves. With ``perplexity``: that many further blocks after all others.
        counts: numbers of linear layers for the held-out comparison (default: four up to the search's
            most-linear hybrid).
        orderings: which of greedy, dof, loss, uniform, random to compare.
        prefix_cache: reuse the teacher's hidden states before the first linear layer.
        batch_size: items per forward.
        seed: item sampling and the random ordering.
        out: run directory (``search.json``, ``tensorboard/``, ``best/``, ``most_linear/``).
        report_dir: also write ``hybrid.md``/``.json``/``.png`` there (default: ``out``).
        command: the command line recorded in the report (``lit-dof hybrid`` fills it in).
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``: where the bank and
            the items go.
        dtype: ``auto`` (the bank's recorded dtype), ``float32``, ``bfloat16`` or ``float16`` for the teacher's
            weights (the feature maps stay float32); the exported hybrids are saved in it. A dtype other than
            ``auto`` is part of the settings a resumed run must repeat.

    Raises:
        ValueError: an unknown metric, shortlist or ordering.
        DeviceError: an unknown device or dtype, or CUDA where there is none.
    """

    bank: str = "runs/hybrid/twins/version_0/student"
    task: str = "arc_easy"
    data_dir: str | None = None
    metric: str = "accuracy"
    corpus: str | None = None
    block: int = 512
    search_items: int = 240
    heldout_items: int = 480
    tolerance: float = 0.03
    relative: bool = False
    shortlist: str | None = "loss"
    shortlist_k: int = 4
    max_linear: int | None = None
    confirm_items: int = 0
    verify_items: int = 0
    counts: list[int] | None = None
    orderings: list[str] = field(default_factory=lambda: list(ORDERINGS))
    prefix_cache: bool = True
    batch_size: int = 8
    seed: int = 0
    out: str = "runs/hybrid/search"
    report_dir: str | None = None
    command: str | None = None
    device: str = "auto"
    dtype: DtypeName = "auto"

    def __post_init__(self) -> None:
        self.torch_device = resolve_device(self.device)  # DeviceError before anything loads
        self.torch_dtype = resolve_model_dtype(self.dtype)
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.shortlist not in (None, "loss", "dof"):
            raise ValueError(f"shortlist must be 'loss', 'dof' or null, got {self.shortlist!r}")
        unknown = sorted(set(self.orderings) - set(ORDERINGS))
        if unknown:
            raise ValueError(f"unknown orderings {unknown}; choose from {', '.join(ORDERINGS)}")

    @property
    def perplexity(self) -> bool:
        """Whether the items come from ``corpus`` — text blocks scored by perplexity or recall items — rather than
        multiple-choice items of ``task``."""
        return self.metric in ("perplexity", "recall")

    @property
    def settings(self) -> RecordedSettings:
        """What the numbers in ``search.json`` depend on; a resumed run must have the same."""
        return RecordedSettings(
            bank=str(self.bank),
            task=None if self.perplexity else self.task,
            metric=self.metric,
            corpus=str(self.corpus) if self.perplexity else None,
            search_items=self.search_items,
            heldout_items=self.heldout_items,
            tolerance=self.tolerance,
            relative=self.relative,
            shortlist=self.shortlist,
            shortlist_k=self.shortlist_k,
            max_linear=self.max_linear,
            prefix_cache=self.prefix_cache,
            seed=self.seed,
            dtype=None if self.dtype == "auto" else self.dtype,
        )

    def task_data_dir(self) -> str:
        """``data_dir``, else ``$LIT_DOF_DATA``.

        Raises:
            ValueError: neither is set.
        """
        data_dir = self.data_dir or os.environ.get("LIT_DOF_DATA")
        if data_dir is None:
            raise ValueError(
                "no data directory: pass --data_dir or set LIT_DOF_DATA (layout: docs/usage.md, 'Task data layout')"
            )
        return data_dir
