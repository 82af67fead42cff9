r"""The LightningCLI of ``lit-dof fit|validate|test|predict`` with its always-present callbacks and linked data/model
arguments, and ``lit-dof plan`` (the ``lit-dof`` command itself, which lists and dispatches every subcommand,
is :mod:`lit_dof.cli`).

    lit-dof fit --config configs/quickstart.yaml
    lit-dof fit --config configs/models/smollm2-135m.yaml --config configs/methods/fix.yaml \
        --config configs/trainer/cpu.yaml
    lit-dof fit --config configs/quickstart.yaml --print_config
    lit-dof plan --config configs/models/llama-3-8b.yaml --config configs/trainer/fsdp.yaml --trainer.devices 8
        (memory per GPU and host RAM per rank, per phase, from the meta-device model: lit_dof.pipeline.plan)

Top-level groups besides LightningCLI's: ``plan_files:`` (:class:`~lit_dof.pipeline.callbacks.PlanFiles`: the
student's DoF report ``<log_dir>/dof.json`` and its figures), ``metrics_file:``
(:class:`~lit_dof.pipeline.run_files.MetricsFile`: ``<log_dir>/metrics.jsonl`` beside any logger),
``failed_run_cleanup:`` (:class:`~lit_dof.pipeline.run_cleanup.FailedRunCleanup`: no empty ``version_N`` left by a
fit that failed before training) and ``finite_gradients:``
(:class:`~lit_dof.pipeline.finite_gradients.FiniteGradients`: a step with NaN/inf gradients stops the fit before
it reaches the weights) — always-present callbacks, so configs need not restate the trainer's callback list.
A fit prints its run directory when it starts, and the run directory and the exported student's folder when
it ends, with a progress bar over the optimizer steps in between (:mod:`lit_dof.pipeline.console`). The feature dims
are the model's own setting (``model.init_args.planner``, :mod:`lit_dof.pipeline.planner`).
``model.teacher`` is linked to ``data.tokenizer`` and ``data.seq_len`` to ``model.seq_len``.
``--optimizer``/``--lr_scheduler`` are refused (:data:`OPTIMIZER_REFUSED`): every phase builds its own optimizers
and schedule. Checkpoints live in the run's own ``version_N/checkpoints``; ``--ckpt_path last`` continues the newest
checkpointed version in place; any ``--ckpt_path`` is read safely (``weights_only``) and refused when it belongs to
another experiment, a setting given here never being replaced by the checkpoint's (:mod:`lit_dof.pipeline.resume`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, LRSchedulerTypeTuple
from torch.optim import Optimizer

from lit_dof.commands import LIGHTNING_COMMANDS, PROG
from lit_dof.pipeline.callbacks import PlanFiles
from lit_dof.pipeline.cli_help import LitDofArgumentParser, command_kwargs, finish_help, import_phases
from lit_dof.pipeline.run_files import MetricsFile

OPTIMIZER_REFUSED = (
    "lit-dof phases build their own optimizers and schedule (LayerwiseDistillation: per-group learning rates, "
    "warm-up + cosine, a fresh optimizer for the end-to-end tail); LightningCLI's --optimizer/--lr_scheduler "
    "would replace them. Set the learning rates with --model.init_args.lr_z, --model.init_args.lr_alpha, "
    "--model.init_args.lr (and lr_lora, warmup_steps, min_lr_ratio, finetune_lr_ratio; "
    "TaskFinetuning: lr, warmup_steps) and the optimizer class with --model.init_args.optimizer "
    "(e.g. torch.optim.AdamW, its init_args without lr)."
)
"""Why ``--optimizer``/``--lr_scheduler`` (or ``optimizer:``/``lr_scheduler:`` in a config) are refused, and the fix."""

PLANNER_MOVED = (
    "the dof: and allocator: groups are now the model's feature-dimension planner, model.init_args.planner "
    "(class_path lit_dof.pipeline.planner.DoFPlanner with their keys, or FixedPlanner with feature_dim for "
    "dof.enabled: false); --dof.<key> and --allocator.<key> are --model.init_args.planner.init_args.<key> "
    "(CHANGELOG.md)."
)
"""Why a ``dof:``/``allocator:`` group (of a config written before the planners) is refused, and the fix."""


class LitDofCLI(LightningCLI):
    """LightningCLI for lit-dof phases (any phase LightningModule via ``model.class_path``: the student
    phases, or :class:`~lit_dof.pipeline.capture.TeacherCapture` for ``predict``)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the ``plan_files:``, ``metrics_file:``, ``failed_run_cleanup:`` and ``finite_gradients:`` groups, link
        teacher → tokenizer and data → model ``seq_len``, mark ``--optimizer``/``--lr_scheduler`` as refused, and add
        ``--help-model`` (:func:`~lit_dof.pipeline.cli_help.finish_help`)."""
        from lit_dof.pipeline.finite_gradients import FiniteGradients
        from lit_dof.pipeline.run_cleanup import FailedRunCleanup

        parser.add_lightning_class_args(PlanFiles, "plan_files")
        parser.add_lightning_class_args(MetricsFile, "metrics_file")
        parser.add_lightning_class_args(FailedRunCleanup, "failed_run_cleanup")
        parser.add_lightning_class_args(FiniteGradients, "finite_gradients")
        parser.link_arguments("model.init_args.teacher", "data.init_args.tokenizer")
        parser.link_arguments("data.init_args.seq_len", "model.init_args.seq_len")
        # LightningCLI's own optimizer/scheduler groups, added here (it then adds none) so that their help says
        # that they are refused; they stay so that saved configs (``optimizer: null``) still parse.
        parser.add_optimizer_args((Optimizer,))
        parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        for action in parser._actions:
            if action.dest in ("optimizer", "lr_scheduler"):
                action.help = f"Refused when set. {OPTIMIZER_REFUSED}"
        finish_help(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Refuse the ``dof:``/``allocator:`` groups of old configs (:data:`PLANNER_MOVED`), parse as LightningCLI
        does, then refuse ``--optimizer``/``--lr_scheduler`` (:data:`OPTIMIZER_REFUSED`) before anything is seeded
        or built.

        Raises:
            SystemExit: any of them is set, on the command line or in a config (message on stderr, code 2).
        """
        legacy = _legacy_groups(sys.argv[1:] if args is None else list(args) if isinstance(args, (list, tuple)) else [])
        if legacy:
            print(f"{parser.prog}: error: {', '.join(legacy)}: {PLANNER_MOVED}", file=sys.stderr)
            raise SystemExit(2)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand, self.config) if subcommand else self.config
        given = [key for key in ("optimizer", "lr_scheduler") if config.get(key) is not None]
        if given:
            command = f"{parser.prog} {subcommand}" if subcommand else parser.prog
            print(
                f"{command}: error: {'/'.join('--' + key for key in given)} is not supported. {OPTIMIZER_REFUSED}",
                file=sys.stderr,
            )
            raise SystemExit(2)

    def before_instantiate_classes(self) -> None:
        """With ``--ckpt_path last``, point the logger at the newest version holding a checkpoint (before the
        trainer builds it), so that the run resumes, logs and checkpoints in that version's directory."""
        self._resume_dir = None
        config = self.config.get(self.subcommand) if self.subcommand else None
        if config is None or config.get("ckpt_path") != "last":
            return
        from lit_dof.pipeline.resume import pin_logger_version

        logger = config.get("trainer", {}).get("logger")
        version = pin_logger_version(logger)
        if version is not None:
            init_args = logger.init_args
            self._resume_dir = os.path.join(init_args.save_dir or ".", init_args.name or "", f"version_{version}")

    def _instantiate_trainer(self, config: dict, callbacks: list) -> L.Trainer:
        """Build the trainer as LightningCLI does, with two more callbacks (:mod:`lit_dof.pipeline.console`):
        :class:`~lit_dof.pipeline.console.StepProgressBar` unless the progress bar is disabled or the configured
        callbacks hold one, and :class:`~lit_dof.pipeline.console.RunPaths`."""
        from lightning.pytorch.callbacks import ProgressBar

        from lit_dof.pipeline.console import RunPaths, StepProgressBar

        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        extra = [*callbacks, RunPaths()]
        if config.get("enable_progress_bar") is not False and not any(
            isinstance(callback, ProgressBar) for callback in [*given, *callbacks]
        ):
            extra.append(StepProgressBar())
        return super()._instantiate_trainer(config, extra)

    def instantiate_classes(self) -> None:
        """Instantiate as LightningCLI does; a model or data module whose constructor refuses its settings raises
        that constructor's own error (jsonargparse wraps it in "Does not validate against any of the Union subtypes",
        listing it beside the ``None`` alternative and the whole parsed namespace).

        Raises:
            ValueError, TypeError: a constructor's error (e.g. ``lr_z=-1.0 … is invalid``), unwrapped.
        """
        try:
            super().instantiate_classes()
        except ValueError as exc:
            if _constructor_error(exc) is exc:
                raise
            raise _constructor_error(exc) from None

    def _parse_ckpt_path(self) -> None:
        """Keep the parsed settings as given: LightningCLI would replace the model's with a checkpoint file's
        hyperparameters, silently overriding the command line; lit-dof compares them instead and refuses a
        difference (:meth:`_check_checkpoint`)."""

    def _check_checkpoint(self) -> None:
        """Refuse a ``--ckpt_path`` that cannot be loaded safely or belongs to another experiment, before the
        teacher loads (:func:`~lit_dof.pipeline.resume.checkpoint_metadata`,
        :func:`~lit_dof.pipeline.resume.check_resume`).

        Raises:
            UnsafeCheckpointError: the checkpoint holds objects other than tensors and plain data (nothing of it ran).
            UnreadableCheckpointError: it is truncated or not a torch checkpoint.
            ResumeMismatchError: ``--ckpt_path`` names (or ``last`` finds) a checkpoint whose model, data or
                allocation settings differ from this run's (each named, with both values).
        """
        from lit_dof.pipeline import resume

        config = self.config[self.subcommand]
        path = resume.resumed_checkpoint(config.get("ckpt_path"), self.trainer, getattr(self, "_resume_dir", None))
        checkpoint = resume.checkpoint_metadata(path) if path else None
        if checkpoint is not None and "hyper_parameters" in checkpoint:
            saved = resume.saved_settings(checkpoint)
            current = resume.current_settings(self.model, self.datamodule)
            resume.check_resume(path, saved, current)

    def before_fit(self) -> None:
        """:meth:`_check_checkpoint` before a fit resumes."""
        self._check_checkpoint()

    def before_validate(self) -> None:
        """:meth:`_check_checkpoint` before a checkpoint is validated."""
        self._check_checkpoint()

    def before_test(self) -> None:
        """:meth:`_check_checkpoint` before a checkpoint is tested."""
        self._check_checkpoint()


def _legacy_groups(argv: list[str]) -> list[str]:
    """What ``argv`` sets of the removed ``dof``/``allocator`` groups: options (``--dof.lam``) and top-level keys of
    its ``--config`` files (``dof: (<file>)``)."""
    import yaml

    found = [arg.split("=", 1)[0] for arg in argv if arg.startswith(("--dof.", "--allocator."))]
    paths = [value for flag, value in zip(argv, argv[1:]) if flag in ("--config", "-c")]
    paths += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    for path in paths:
        try:
            content = yaml.safe_load(Path(path).read_text())
        except (OSError, ValueError, yaml.YAMLError):  # not a readable file (an inline config): the parser reads it
            continue
        found += [f"{key}: ({path})" for key in ("dof", "allocator") if isinstance(content, dict) and key in content]
    return found


def build_cli(args=None, run: bool = True, cli_class: type[LitDofCLI] = LitDofCLI) -> LitDofCLI:
    """Parse ``args`` (default: ``sys.argv``) and, with ``run``, execute the subcommand (``cli_class``: a
    subclass of :class:`LitDofCLI` to build instead, e.g. one that observes the run). lit-dof's phases and data
    modules are imported first, so that their short names resolve (``--model.help LayerwiseDistillation``)."""
    import_phases()
    return cli_class(
        L.LightningModule,
        L.LightningDataModule,  # WikipediaDataModule, or MultipleChoiceDataModule for task fine-tuning
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": PROG, **{name: command_kwargs(name) for name in LIGHTNING_COMMANDS}},
        parser_class=LitDofArgumentParser,
        args=args,
        run=run,
    )


def _constructor_error(exc: ValueError) -> ValueError:
    """The constructor's own error inside jsonargparse's "Does not validate against any of the Union subtypes"
    (which lists it beside the ``None`` alternative and the whole namespace), else ``exc`` itself."""
    cause = exc.__cause__
    if str(exc).startswith("Does not validate against any of the Union subtypes") and isinstance(cause, ValueError):
        return cause
    return exc


class _ConfigOnlyCLI(LitDofCLI):
    """The ``fit`` parser of :class:`LitDofCLI` that parses and instantiates what the parser instantiates — the
    model (which loads its teacher only at ``configure_model``), the data module, the trainer's callbacks and
    strategy — as the fit does, but builds no trainer and sets no seed."""

    def _set_seed(self) -> None:
        pass

    def _add_instantiators(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        """``config_init``: the namespace with the model and data module instantiated (LightningCLI's first step).

        Raises:
            ValueError, TypeError: a constructor's error, unwrapped as :meth:`LitDofCLI.instantiate_classes` does.
        """
        try:
            parser = self.parser  # jsonargparse ≥ 4.49 names LightningCLI's instantiate_classes "instantiate"
            instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
            self.config_init = instantiate(self.config)
        except ValueError as exc:
            if _constructor_error(exc) is exc:
                raise
            raise _constructor_error(exc) from None


class _ParseOnlyCLI(_ConfigOnlyCLI):
    """:class:`_ConfigOnlyCLI` that instantiates nothing: ``config_init`` is the composed, parsed namespace."""

    def instantiate_classes(self) -> None:
        self.config_init = self.config


def parse_fit_config(args: list[str], instantiate: bool = True):
    """Parse ``args`` as ``lit-dof fit`` would (the same ``--config`` files and overrides, no subcommand) and
    return the namespace with the model and data module instantiated by the same composition (no teacher is
    loaded, no trainer built: ``trainer`` holds its settings).

    Args:
        args: the ``lit-dof fit`` arguments (``--config`` files and overrides).
        instantiate: ``False`` returns the composed namespace with nothing instantiated (``class_path`` +
            ``init_args`` everywhere): what two compositions of config files are compared by.

    Raises:
        SystemExit: a parse error (jsonargparse prints it).
        ValueError, TypeError: a constructor refuses its settings (as ``lit-dof fit`` would).
    """
    import warnings

    with warnings.catch_warnings():  # "args and sys.argv both given": plan_main passes sys.argv's tail on purpose
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
        parser_kwargs = {"prog": f"{PROG} plan", **command_kwargs("plan")}
        import_phases()
        cli = (_ConfigOnlyCLI if instantiate else _ParseOnlyCLI)(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=None,
            args=args,
            run=False,
            parser_kwargs=parser_kwargs,
            parser_class=LitDofArgumentParser,
        )
    return cli.config_init


def plan_main(args: list[str]) -> str:
    """``lit-dof plan``: parse ``args`` as ``lit-dof fit`` would, build the teacher on the meta device and print
    the memory plan (:mod:`lit_dof.pipeline.plan`).

    Returns:
        the printed plan; its last line is ``plan peak_gpu_gib=<x> host_gib=<y>``.

    Raises:
        SystemExit: a parse error, or a :class:`~lit_dof.pipeline.architecture.PlanError` (message on stderr, code 2).
    """
    import sys

    from lit_dof.pipeline.architecture import PlanError
    from lit_dof.pipeline.plan_report import format_plan, plan_config

    try:
        arch, run, phases = plan_config(parse_fit_config(args))
    except PlanError as exc:
        print(f"lit-dof plan: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    text = format_plan(arch, run, phases)
    print(text)
    return text


if __name__ == "__main__":  # ``python -m lit_dof.pipeline.cli …``, the older entry: the ``lit-dof`` command itself
    import runpy

    runpy.run_module("lit_dof", run_name="__main__", alter_sys=True)
