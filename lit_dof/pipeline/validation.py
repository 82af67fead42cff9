"""Settings refused before anything expensive runs: the teacher's weights, the DoF estimate, the q/k capture.

The phases and the DoF planner call these from their constructors (numbers that can never train: a learning
rate ≤ 0 or NaN, a ratio outside its range; :func:`check_dof_planner`) and from ``setup``
(:func:`check_student_setup`), which Lightning calls before ``configure_model`` loads the teacher: a fit without
optimizer steps, and blocks longer than the teacher's positions, read from its config without its weights
(:func:`~lit_dof.pipeline.architecture.resolve_teacher_config`).
Every error is a ``ValueError`` naming the option, what is wrong with it and the fix.
"""

from __future__ import annotations

import math

from lit_dof.students.query_rows import StratifiedRows

MODEL_ARGS = "--model.init_args."
"""The command-line prefix of a phase's own options."""

PLANNER_ARGS = "--model.init_args.planner.init_args."
"""The command-line prefix of the feature-dimension planner's options."""


def _requirement(minimum: float, maximum: float, open_min: bool, open_max: bool, integer: bool) -> str:
    low, high = ("(" if open_min else "["), (")" if open_max else "]")
    kind = "an integer" if integer else "a finite number"
    if math.isinf(maximum):
        return f"{kind} {'>' if open_min else '>='} {minimum:g}"
    return f"{kind} in {low}{minimum:g}, {maximum:g}{high}"


def check_number(
    name: str,
    value,
    *,
    minimum: float,
    maximum: float = math.inf,
    open_min: bool = False,
    open_max: bool = False,
    integer: bool = False,
    option: str = MODEL_ARGS,
    example=None,
    what: str = "",
    requirement: str | None = None,
) -> None:
    """Refuse a numeric setting that is not finite or lies outside ``[minimum, maximum]`` (open ends as told).

    Args:
        name: the setting's name (its option is ``option + name``).
        value: its value.
        minimum: the lower bound.
        maximum: the upper bound (``inf``: none).
        open_min: exclude ``minimum`` itself (``> minimum``).
        open_max: exclude ``maximum`` itself.
        integer: the value must be an ``int`` (not a ``bool``).
        option: the command-line prefix the message names.
        example: a good value the message suggests (usually the default).
        what: what the setting is, for the message.
        requirement: the message's statement of the rule (default: from the bounds).

    Raises:
        ValueError: naming the option, the value, the rule and the fix.
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if number and (isinstance(value, int) or not integer):
        above = value > minimum if open_min else value >= minimum
        if above and (value < maximum if open_max else value <= maximum):
            return
    rule = requirement or _requirement(minimum, maximum, open_min, open_max, integer)
    about = f" ({what})" if what else ""
    hint = f", e.g. {example}" if example is not None else ""
    raise ValueError(f"{name}={value!r}{about} is invalid: it must be {rule}; set {option}{name} to such a value{hint}")


def check_learning_rate(name: str, value, *, example, what: str = "a learning rate", option: str = MODEL_ARGS) -> None:
    """Refuse a learning rate that is not a finite number > 0 (≤ 0 trains nothing or climbs the loss; NaN or inf
    destroys the weights at the first step).

    Args:
        name: the option's name.
        value: its value.
        example: a good value (the default).
        what: what it trains, for the message.
        option: the command-line prefix.

    Raises:
        ValueError: naming the option, the value and the fix.
    """
    check_number(name, value, minimum=0.0, open_min=True, option=option, example=example, what=what)


def check_schedule(
    *, lr_z, lr_alpha, lr, lr_lora, warmup_steps, min_lr_ratio, finetune_lr_ratio, kd_temperature, query_rows
) -> None:
    """Refuse the layer-wise and direct phases' optimizer settings that cannot train
    (:class:`~lit_dof.pipeline.layerwise.LayerwiseDistillation`'s arguments of the same names).

    Raises:
        ValueError: a learning rate, ``finetune_lr_ratio`` or ``kd_temperature`` that is not a finite number > 0,
            a negative ``warmup_steps``, ``min_lr_ratio`` outside [0, 1], ``query_rows`` < 1 (``None``: all rows).
    """
    check_learning_rate("lr_z", lr_z, example=0.02, what="learning rate of the feature maps' projections z")
    check_learning_rate("lr_alpha", lr_alpha, example=0.2, what="learning rate of the feature maps' log α")
    check_learning_rate("lr", lr, example=0.02, what="learning rate of the other feature-map parameters")
    check_learning_rate("lr_lora", lr_lora, example=1e-3, what="learning rate of the LoRA adapters")
    check_number("warmup_steps", warmup_steps, minimum=0, integer=True, example=20, what="linear warm-up steps")
    check_number(
        "min_lr_ratio",
        min_lr_ratio,
        minimum=0.0,
        maximum=1.0,
        example=0.1,
        what="floor of the cosine decay, a fraction of each learning rate",
    )
    check_number(
        "finetune_lr_ratio",
        finetune_lr_ratio,
        minimum=0.0,
        open_min=True,
        example=0.1,
        what="learning rates of the end-to-end tail, a fraction of the base ones",
    )
    check_number(
        "kd_temperature",
        kd_temperature,
        minimum=0.0,
        open_min=True,
        example=1.0,
        what="temperature of the logit distillation",
    )
    if query_rows is not None and not isinstance(query_rows, StratifiedRows):  # which checks itself
        check_number(
            "query_rows",
            query_rows,
            minimum=1,
            integer=True,
            example=128,
            what="query rows scored per sequence; null: all",
        )


def as_number(value):
    """``value`` as a float where it reads as one (a YAML string ``"1e-3"``), else unchanged (refused later)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def check_dof_planner(*, budget, multiple_of, min_dim, lam, num_samples, num_batches, target_fraction) -> None:
    """Refuse :class:`~lit_dof.pipeline.planner.DoFPlanner` settings that would fail only after the teacher loads
    and its q/k are captured."""
    if budget is not None:
        check_number(
            "budget",
            budget,
            minimum=1,
            integer=True,
            option=PLANNER_ARGS,
            example=64,
            what="mean feature dim per layer; null: the head size",
        )
    check_number(
        "multiple_of",
        multiple_of,
        minimum=1,
        integer=True,
        option=PLANNER_ARGS,
        example=1,
        what="every dim is rounded to a multiple of it",
    )
    check_number(
        "min_dim",
        min_dim,
        minimum=1,
        integer=True,
        option=PLANNER_ARGS,
        example=8,
        what="the smallest feature dim any layer gets",
    )
    if lam != "auto":
        check_number(
            "lam",
            lam,
            minimum=0.0,
            open_min=True,
            option=PLANNER_ARGS,
            example="auto",
            what="the ridge λ of the DoF",
            requirement="a finite number > 0 or 'auto'",
        )
    check_number(
        "num_samples",
        num_samples,
        minimum=2,
        integer=True,
        option=PLANNER_ARGS,
        example=1024,
        what="J, the q/k samples kept per head",
    )
    check_number(
        "num_batches",
        num_batches,
        minimum=1,
        integer=True,
        option=PLANNER_ARGS,
        example=8,
        what="training batches captured for the estimate",
    )
    check_number(
        "target_fraction",
        target_fraction,
        minimum=0.0,
        maximum=1.0,
        open_min=True,
        open_max=True,
        option=PLANNER_ARGS,
        example=0.25,
        what="with lam='auto', the mean layer DoF as a fraction of J",
    )


def check_fit_steps(trainer, *, needs_max_steps: bool) -> None:
    """Refuse a fit that trains nothing (``max_steps``, ``max_epochs`` or ``limit_train_batches`` 0) and, with
    ``needs_max_steps``, one without a step count (``max_steps=-1``: the student phases' training stream has no
    length, so Lightning would read up to 1000 passes over the corpus, and their schedule — warm-up, cosine,
    end-to-end tail — is laid out over ``max_steps``).

    Args:
        trainer: the Lightning trainer about to fit.
        needs_max_steps: whether the phase needs ``max_steps >= 1``.

    Raises:
        ValueError: naming the trainer option and the fix.
    """
    max_steps = trainer.max_steps
    if max_steps == 0:
        raise ValueError(
            "--trainer.max_steps=0 trains nothing: the fit would end at once and export the untrained model; "
            "set --trainer.max_steps to the number of optimizer steps (>= 1)"
        )
    if needs_max_steps and max_steps < 0:
        raise ValueError(
            f"--trainer.max_steps={max_steps} (unset) gives no step count: the training stream has no length "
            "(Lightning would read up to 1000 passes over the corpus) and the learning-rate schedule and end-to-end "
            "tail are laid out over max_steps; set --trainer.max_steps to the number of optimizer steps (>= 1)"
        )
    for option, value in (("max_epochs", trainer.max_epochs), ("limit_train_batches", trainer.limit_train_batches)):
        if value == 0:
            raise ValueError(f"--trainer.{option}=0 trains nothing; set it >= 1, or leave it unset")


def teacher_config(teacher: str):
    """The teacher's ``PretrainedConfig`` read without its weights, or ``None`` where that is impossible (the load
    will report why).

    Args:
        teacher: the teacher as the module names it (alias, directory, ``.gguf`` file, hub id).

    Returns:
        :func:`~lit_dof.pipeline.architecture.resolve_teacher_config`'s config, or ``None``.
    """
    from lit_dof.pipeline.architecture import resolve_teacher_config

    try:
        return resolve_teacher_config(teacher)
    except Exception:  # any reason (no config, unreadable metadata): skip the early check
        return None


def check_seq_len(config, seq_len: int) -> None:
    """Refuse training blocks longer than the teacher's ``max_position_embeddings`` (none: nothing to check).

    Args:
        config: the teacher's config.
        seq_len: tokens per block.

    Raises:
        ValueError: ``seq_len`` beyond the teacher's positions, with the largest allowed value.
    """
    limit = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
    if limit is not None and seq_len > limit:
        raise ValueError(
            f"seq_len={seq_len} exceeds the teacher's max_position_embeddings ({limit}): it has no positions past "
            f"{limit}, so longer blocks would train on positions it never learned; set --data.init_args.seq_len <= "
            f"{limit}"
        )


def check_position_shift(config, seq_len: int, position_shift: int | str) -> None:
    """Refuse an explicit ``position_shift`` the teacher cannot take (0 and ``"auto"``: nothing to check).

    Args:
        config: the teacher's config (of the loaded teacher, or read without weights).
        seq_len: tokens per block.
        position_shift: the largest random position offset.

    Raises:
        ValueError: a shift for a teacher without rotary positions, or ``position_shift + seq_len`` beyond its
            ``max_position_embeddings``.
    """
    from lit_dof.teacher.families import has_rotary_positions

    if not position_shift or position_shift == "auto":
        return
    text = config.get_text_config(decoder=True)
    if not has_rotary_positions(config):
        raise ValueError(
            f"position_shift={position_shift} needs a teacher with rotary (relative) positions; "
            f"{text.model_type!r} has absolute position embeddings, whose outputs a shift would change: "
            "set position_shift: 0"
        )
    limit = getattr(text, "max_position_embeddings", None)
    if limit is not None and position_shift + seq_len > limit:
        raise ValueError(
            f"position_shift + seq_len = {position_shift} + {seq_len} exceeds the teacher's "
            f"max_position_embeddings ({limit}): set position_shift <= {max(0, limit - seq_len)}"
        )


def check_student_setup(module, stage: str) -> None:
    """What a student phase's ``setup`` refuses before ``configure_model`` loads the teacher: a fit without
    optimizer steps (:func:`check_fit_steps`), and a ``seq_len`` (with its ``position_shift``) past the teacher's
    positions, from its config read without weights (skipped where it cannot be).

    Args:
        module: the :class:`~lit_dof.pipeline.module.StudentModule` (its ``teacher_name``, ``seq_len`` and, where it
            has one, ``position_shift``).
        stage: Lightning's stage (``"fit"``, ``"validate"``, …).

    Raises:
        ValueError: see :func:`check_fit_steps`, :func:`check_seq_len` and :func:`check_position_shift`.
    """
    if stage == "fit" and module._trainer is not None:
        check_fit_steps(module._trainer, needs_max_steps=True)
    config = teacher_config(module.teacher_name)
    if config is not None:
        check_seq_len(config, module.seq_len)
        check_position_shift(config, module.seq_len, getattr(module, "position_shift", 0))
