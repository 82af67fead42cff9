r"""``lit-dof hybrid``: the command-line face of Distill-then-Replace's search over a bank of linear twins
(:class:`~lit_dof.hybrid.run.HybridSearch`, which documents the stages), end to end and resumable.

    lit-dof fit --config configs/quickstart.yaml --config configs/hybrid/twins.yaml     # 1. the twin bank
    lit-dof hybrid --bank runs/hybrid/twins/version_0/student --task arc_easy \
        --data_dir $LIT_DOF_DATA --out runs/hybrid/search                               # 2. search + report
"""

from __future__ import annotations

import sys

from lit_dof.devices import device_errors_exit
from lit_dof.hybrid.orderings import ORDERINGS
from lit_dof.hybrid.run import HybridSearch
from lit_dof.io import portable
from lit_dof.precision import DtypeName


def search(
    bank: str = "runs/hybrid/twins/version_0/student",
    task: str = "arc_easy",
    data_dir: str | None = None,
    metric: str = "accuracy",
    corpus: str | None = None,
    block: int = 512,
    search_items: int = 240,
    heldout_items: int = 480,
    tolerance: float = 0.03,
    relative: bool = False,
    shortlist: str | None = "loss",
    shortlist_k: int = 4,
    max_linear: int | None = None,
    confirm_items: int = 0,
    verify_items: int = 0,
    counts: list[int] | None = None,
    orderings: list[str] = list(ORDERINGS),  # noqa: B006 (a list, as --help shows it; never mutated)
    prefix_cache: bool = True,
    batch_size: int = 8,
    seed: int = 0,
    out: str = "runs/hybrid/search",
    report_dir: str | None = None,
    command: str | None = None,
    device: str = "auto",
    dtype: DtypeName = "auto",
) -> dict:
    """Search a hybrid within ``tolerance`` of the teacher, export it, compare orderings on held-out items.

    Args:
        bank: a student directory whose every layer has a linear twin (``lit-dof fit`` with
            ``configs/hybrid/twins.yaml``).
        task: the target task (one of lit_dof.evaluation.task_data.TASKS), for the accuracy metrics.
        data_dir: folder in the task data layout (docs/usage.md; default ``$LIT_DOF_DATA``).
        metric: ``accuracy`` (lm-eval's acc), ``acc_norm`` or ``perplexity`` (on ``corpus``).
        corpus: text corpus for ``perplexity`` (its held-out documents; WikiExtractor or plain text).
        block: tokens per perplexity block.
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

    Returns:
        the contents of ``search.json``.

    Raises:
        ValueError: bad settings (unknown metric/ordering/shortlist, a bank without twins), or an ``out``
            written with other settings. FileNotFoundError: missing bank or data. DeviceError: an unknown
            device or dtype, or CUDA where there is none (before the bank loads).
    """
    settings = dict(locals())  # the parameters above, nothing else yet
    return HybridSearch(**settings).run()


def main(args: list[str] | None = None) -> None:
    """``lit-dof hybrid``: :func:`search` from the command line (jsonargparse; ``--config`` works). The
    command line is recorded in the report, without this machine's paths."""
    from lit_dof.help_text import command_cli

    args = sys.argv[2:] if args is None else list(args)
    command = ["--command", portable(["lit-dof", "hybrid", *args])]
    with device_errors_exit("lit-dof hybrid"):
        command_cli(search, [*args, *command], "lit-dof hybrid")
