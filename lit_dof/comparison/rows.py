"""The comparison's methods (:class:`Row`, the default :data:`ROWS`), the metric shown per task, and the grid
of cells they make with the budgets and seeds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lit_dof.config_files import config_root

REPO_CONFIGS = config_root()
"""The folder the rows' config files are relative to."""

PLANNER_ARGS = "--model.init_args.planner.init_args"
"""The prefix of the feature-dimension planner's settings on a ``lit-dof fit`` command line."""

DEFAULT_PLANNER = "lit_dof.pipeline.planner.DoFPlanner"
"""The planner of a student module whose configs name none."""

PRIMARY_METRIC = {
    "piqa": "acc_norm",
    "logiqa": "acc_norm",
    "arc_easy": "acc_norm",
    "arc_challenge": "acc_norm",
    "winogrande": "acc",
    "wsc273": "acc",
    "mmlu": "acc",
    "mmlu_5shot": "acc",
}
"""The metric shown per task (lm-eval's usual headline: acc_norm where defined for multi-word choices)."""


@dataclass(frozen=True)
class Row:
    """One method of the comparison: config files (relative to ``configs/``) and extra CLI arguments
    composed on top of the base config. ``kind``: ``"teacher"`` (no fit), ``"student"`` or ``"control"`` (no fit:
    the control ``control`` of the student of row ``of``, :func:`control_rows`). ``reference``: the row it is
    measured against at the same budget (paired task differences, validation-perplexity ratios): Fix trained with
    the same loss, so that DoF − Fix isolates the allocation; a control's is its student."""

    name: str
    configs: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    kind: str = "student"
    note: str = ""
    reference: str = "fix"
    control: str | None = None
    of: str | None = None


UNTRAINED = ("--trainer.max_steps=1", "--trainer.val_check_interval=1", "--model.init_args.finetune_fraction=0")
ROWS: dict[str, Row] = {
    r.name: r
    for r in [
        Row("teacher", kind="teacher", note="softmax attention"),
        Row("performer", ("methods/performer.yaml",), UNTRAINED, note="FAVOR+, untrained"),
        Row("fix", ("methods/fix.yaml",), note="learned PRF, uniform M, softmax loss"),
        Row("dof", ("methods/dof.yaml",), note="learned PRF, DoF allocation (λ auto), softmax loss"),
        Row("dof_clip", ("methods/dof_clip.yaml",), note="DoF capped at C, softmax loss"),
        Row("dof_head", ("methods/dof_head.yaml",), note="learned PRF, DoF dims per KV head, softmax loss"),
        Row("fix_l2", ("methods/fix.yaml", "methods/l2.yaml"), note="L2 kernel loss"),
        Row("dof_l2", ("methods/dof.yaml", "methods/l2.yaml"), note="L2 kernel loss", reference="fix_l2"),
        Row("dof_clip_l2", ("methods/dof_clip.yaml", "methods/l2.yaml"), note="L2 kernel loss", reference="fix_l2"),
        Row("direct", ("methods/dof.yaml", "methods/direct.yaml"), note="end-to-end next-token loss, DoF dims"),
        Row("dijiang", ("methods/dijiang.yaml",), note="DCT features, uniform M"),
        Row("hedgehog", ("methods/hedgehog.yaml",), note="softmax-of-linear features, uniform M"),
        # Sliding-window rows: the untrained controls (the teacher behind a 64-token window, with and without 4
        # attention sinks) and the window + linear recipes measured against the window-plus-sink control.
        Row("swa_only", ("methods/swa_only.yaml",), note="window 64, nothing trained", reference="swa_sink"),
        Row("swa_sink", ("methods/swa_sink.yaml",), note="window 64 + 4 sinks, nothing trained", reference="swa_sink"),
        Row(
            "swa_linear",
            ("methods/swa_linear.yaml",),
            note="window 64 + learned PRF far term, DoF dims",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear",
            ("methods/swa_sink_linear.yaml",),
            note="window 64 + 4 sinks + learned PRF far term, DoF dims",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear_shift",
            ("methods/swa_sink_linear.yaml",),
            ("--model.init_args.position_shift=7680",),
            note="swa_sink_linear trained at random absolute positions (offsets up to 7680)",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear_2k",
            ("methods/swa_sink_linear.yaml",),
            (
                "--data.init_args.seq_len=2048",
                "--data.init_args.batch_size=1",
                "--trainer.max_steps=400",
                "--trainer.val_check_interval=200",
                "--model.init_args.position_shift=auto",
            ),
            note="swa_sink_linear trained on 2048-token blocks at random absolute positions (same tokens, half the "
            "steps)",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear_decay",
            ("methods/swa_sink_linear_decay.yaml",),
            note="swa_sink_linear with far terms decaying past the window (τ = 128 tokens)",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear_decay_shift",
            ("methods/swa_sink_linear_decay.yaml",),
            ("--model.init_args.position_shift=7680",),
            note="swa_sink_linear_decay trained at random absolute positions (offsets up to 7680)",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear_norope",
            ("methods/swa_sink_linear_norope.yaml",),
            note="swa_sink_linear with the far term's maps on un-rotated q/k (position-free far term)",
            reference="swa_sink",
        ),
        Row(
            "swa_sink_linear_decay_norope",
            ("methods/swa_sink_linear_decay.yaml",),
            ("--model.init_args.sliding_window.far_rope=false",),
            note="swa_sink_linear_decay with the far term's maps on un-rotated q/k",
            reference="swa_sink",
        ),
        # The field's recipe (LoLCATs: window + Hedgehog maps, output-matching transfer, LoRA tail) and LoRA on a
        # pure linear student.
        Row(
            "lolcats",
            ("methods/lolcats.yaml",),
            note="window 64 + Hedgehog far term, block-output loss, LoRA tail, DoF dims",
            reference="swa_sink",
        ),
        Row("lora", ("methods/lora.yaml",), note="pure linear, learned PRF, DoF dims, LoRA tail"),
        Row(
            "quickstart",
            note="the quickstart: window 64 + 4 sinks + a decaying, position-free PRF far term, DoF "
            "dims, LoRA r = 8 on q/k/v/o in its tail",
            reference="swa_sink",
        ),
        Row(
            "quickstart_nolora",
            args=("--model.init_args.lora=null",),
            note="the quickstart without its LoRA tail (the quickstart until 2026-11-26)",
            reference="swa_sink",
        ),
        Row(
            "quickstart_gate",
            args=("--model.init_args.sliding_window.far_gate=true",),
            note="the quickstart with a forget gate on its far memory, set per token from the value vector "
            "(starts at its τ = 128 decay; docs/method_students.md)",
            reference="swa_sink",
        ),
        Row(
            "quickstart_gate_dropout",
            args=(
                "--model.init_args.sliding_window.far_gate=true",
                "--model.init_args.window_dropout.rate=0.25",
                "--model.init_args.window_dropout.window=16",
            ),
            note="quickstart_gate trained with its window cut to 16 tokens on a quarter of the layer-wise steps "
            "(against bypass)",
            reference="swa_sink",
        ),
        Row(
            "quickstart_delta",
            args=(
                "--model.init_args.sliding_window.far_gate=true",
                "--model.init_args.sliding_window.far_memory=delta",
                "--model.init_args.loss=lit_dof.students.layer_losses.OutputLoss",
            ),
            note="quickstart_gate with its far values read from a delta-rule memory (block-output loss; "
            "docs/method_students.md)",
            reference="swa_sink",
        ),
        Row(
            "quickstart_dof_head",
            (),
            (f"{PLANNER_ARGS}.strategy=dof_head", f"{PLANNER_ARGS}.multiple_of=8"),
            note="the quickstart with per-KV-head DoF dims (its far term's)",
            reference="swa_sink",
        ),
        # The λ study (METHOD.md §2): DoF at fixed absolute λ and with the relative rule, next to "dof" (auto).
        Row("dof_lam2^48", ("methods/dof.yaml",), (f"{PLANNER_ARGS}.lam=281474976710656",), note="λ = 2^48"),
        Row("dof_lam2^56", ("methods/dof.yaml",), (f"{PLANNER_ARGS}.lam=72057594037927936",), note="λ = 2^56"),
        Row("dof_lam2^64", ("methods/dof.yaml",), (f"{PLANNER_ARGS}.lam=18446744073709551616",), note="λ = 2^64"),
        Row(
            "dof_rel_trace",
            ("methods/dof.yaml",),
            (f"{PLANNER_ARGS}.relative_to=trace", f"{PLANNER_ARGS}.lam=0.00390625"),
            note="λ = 2^-8 · tr(G)/J",
        ),
    ]
}
"""The default rows (``--rows`` picks a subset, in any order)."""


CONTROLS = {
    "window_sinks": "control (a): the teacher behind the student's own window + sinks, no far term",
    "equal_state": "control (b): the teacher behind the window whose KV cache holds the student's decode state, "
    "+ its sinks",
    "tail_only": "control (c): the student's LoRA-merged weights with full softmax attention, no linear part",
    "far_only": "control (d): the student with its window cut to the token itself and no sinks — its far term alone",
}
"""The controls every student is shown beside (:func:`lit_dof.evaluation.controls.control_models`), by name."""


def control_rows(row: Row) -> list[Row]:
    """The control rows of a student row: ``<row>:window_sinks`` (a), ``<row>:equal_state`` (b),
    ``<row>:tail_only`` (c) and ``<row>:far_only`` (d), each measured against the student (``reference``). Whether
    the student has a control (a pure linear one has no (a) and no (d), one without a tail no (c)) is known only once
    it is fitted.

    Args:
        row: a student row.

    Returns:
        The four rows.

    Raises:
        ValueError: ``row`` is not a student row.
    """
    if row.kind != "student":
        raise ValueError(f"{row.name} is a {row.kind} row: only students have controls")
    return [
        Row(f"{row.name}:{name}", kind="control", note=note, reference=row.name, control=name, of=row.name)
        for name, note in CONTROLS.items()
    ]


def grid(rows: Sequence[Row], budgets: Sequence[int], seeds: Sequence[int]) -> Iterator[tuple[int, int, Row]]:
    """The cells to run or report, in table order; the teacher once (first budget and seed): it has neither.

    Args:
        rows: the selected rows.
        budgets: feature budgets C.
        seeds: training seeds.

    Yields:
        ``(budget, seed, row)`` per cell.
    """
    for budget in budgets:
        for seed in seeds:
            for row in rows:
                if row.kind != "teacher" or (budget == budgets[0] and seed == seeds[0]):
                    yield budget, seed, row


def planner_class(configs: Sequence[str | Path], args: Sequence[str] = ()) -> str:
    """The feature-dimension planner that ``lit-dof fit`` builds from these config files and arguments: the last
    ``model.init_args.planner`` class set (a class path, or a mapping with ``class_path``; jsonargparse's composition
    keeps a class until another is named), else :data:`DEFAULT_PLANNER`.

    Args:
        configs: the ``--config`` files, in order.
        args: the other arguments, in order (``--model.init_args.planner=<class>`` or ``….planner.class_path=…``).

    Returns:
        The class path, as written (jsonargparse also takes a class's bare name).
    """
    import yaml

    from lit_dof.pipeline.fit_config import FitConfig, named_planner

    found = DEFAULT_PLANNER
    for path in [p for p in map(Path, configs) if p.is_file()]:  # a missing file: the fit itself reports it
        found = FitConfig.load(path).planner_class or found
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("--model.init_args.planner", "--model.init_args.planner.class_path"):
            found = named_planner(yaml.safe_load(value)) or found
    return found
