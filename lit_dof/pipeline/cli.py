r"""The LightningCLI of ``lit-dof fit|validate|test|predict`` with the DoF callbacks and linked data/model
arguments, and ``lit-dof plan`` (the ``lit-dof`` command itself, which lists and dispatches every subcommand,
is :mod:`lit_dof.cli`).

    lit-dof fit --config configs/quickstart.yaml
    lit-dof fit --config configs/models/smollm2-135m.yaml --config configs/methods/fix.yaml \
        --config configs/trainer/cpu.yaml
    lit-dof fit --config configs/quickstart.yaml --print_config
    lit-dof plan --config configs/models/llama-3-8b.yaml --config configs/trainer/fsdp.yaml --trainer.devices 8
        (memory per GPU and host RAM per rank, per phase, from the meta-device model: lit_dof.pipeline.plan)

Top-level groups besides LightningCLI's: ``dof:`` (:class:`~lit_dof.pipeline.callbacks.DoFEstimator`),
``allocator:`` (:class:`~lit_dof.pipeline.callbacks.FeatureDimAllocator`) and ``metrics_file:``
(:class:`~lit_dof.pipeline.run_files.MetricsFile`: ``<log_dir>/metrics.jsonl`` beside any logger) — always-present
callbacks, so method files override a few keys instead of restating the trainer's callback list. ``model.teacher`` is
linked to ``data.tokenizer`` and ``data.seq_len`` to ``model.seq_len``. ``--optimizer``/``--lr_scheduler`` are
refused (:data:`OPTIMIZER_REFUSED`): every phase builds its own optimizers and schedule. Checkpoints live in the
run's own ``version_N/checkpoints``; ``--ckpt_path last`` continues the newest checkpointed version in place and
refuses a checkpoint of another experiment (:mod:`lit_dof.pipeline.resume`).
"""

from __future__ import annotations

import os
import sys

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, LRSchedulerTypeTuple
from torch.optim import Optimizer

from lit_dof.commands import COMMANDS, LIGHTNING_COMMANDS, PROG
from lit_dof.pipeline.callbacks import DoFEstimator, FeatureDimAllocator
from lit_dof.pipeline.run_files import MetricsFile

OPTIMIZER_REFUSED = (
    "lit-dof phases build their own optimizers and schedule (LayerwiseDistillation: per-group learning rates, "
    "warm-up + cosine, a fresh optimizer for the end-to-end tail); LightningCLI's --optimizer/--lr_scheduler "
    "would replace them. Set the learning rates with --model.init_args.lr_z, --model.init_args.lr_alpha, "
    "--model.init_args.lr (and lr_lora, warmup_steps, min_lr_ratio, finetune_lr_ratio; "
    "TaskFinetuning: lr, weight_decay, warmup_steps)."
)
"""Why ``--optimizer``/``--lr_scheduler`` (or ``optimizer:``/``lr_scheduler:`` in a config) are refused, and the fix."""


class LitDofCLI(LightningCLI):
    """LightningCLI for lit-dof phases (any phase LightningModule via ``model.class_path``: the student
    phases, or :class:`~lit_dof.pipeline.capture.TeacherCapture` for ``predict``)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the ``dof:``, ``allocator:`` and ``metrics_file:`` groups, link teacher → tokenizer and data → model
        ``seq_len``, and mark ``--optimizer``/``--lr_scheduler`` as refused."""
        parser.add_lightning_class_args(DoFEstimator, "dof")
        parser.add_lightning_class_args(FeatureDimAllocator, "allocator")
        parser.add_lightning_class_args(MetricsFile, "metrics_file")
        parser.link_arguments("model.init_args.teacher", "data.init_args.tokenizer")
        parser.link_arguments("data.init_args.seq_len", "model.init_args.seq_len")
        # LightningCLI's own optimizer/scheduler groups, added here (it then adds none) so that their help says
        # that they are refused; they stay so that saved configs (``optimizer: null``) still parse.
        parser.add_optimizer_args((Optimizer,))
        parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        for action in parser._actions:
            if action.dest in ("optimizer", "lr_scheduler"):
                action.help = f"Refused when set. {OPTIMIZER_REFUSED}"

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse as LightningCLI does, then refuse ``--optimizer``/``--lr_scheduler`` (:data:`OPTIMIZER_REFUSED`)
        before anything is seeded or built.

        Raises:
            SystemExit: either is set, on the command line or in a config (message on stderr, code 2).
        """
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

    def before_fit(self) -> None:
        """Refuse to resume a checkpoint of another experiment (:func:`~lit_dof.pipeline.resume.check_resume`).

        Raises:
            ResumeMismatchError: ``--ckpt_path`` names (or ``last`` finds) a checkpoint whose model, data or
                allocator settings differ from this run's.
        """
        from lit_dof.pipeline import resume

        path = resume.resumed_checkpoint(self.config[self.subcommand].get("ckpt_path"), self.trainer, self._resume_dir)
        checkpoint = resume.checkpoint_metadata(path) if path else None
        if checkpoint is not None and "hyper_parameters" in checkpoint:
            saved = resume.saved_settings(checkpoint, self.trainer.callbacks)
            current = resume.current_settings(self.model, self.datamodule, self.trainer.callbacks)
            resume.check_resume(path, saved, current)


def build_cli(args=None, run: bool = True) -> LitDofCLI:
    """Parse ``args`` (default: ``sys.argv``) and, with ``run``, execute the subcommand."""
    return LitDofCLI(
        L.LightningModule,
        L.LightningDataModule,  # WikipediaDataModule, or MultipleChoiceDataModule for task fine-tuning
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": PROG, **{name: {"description": COMMANDS[name]} for name in LIGHTNING_COMMANDS}},
        args=args,
        run=run,
    )


class _ConfigOnlyCLI(LitDofCLI):
    """The ``fit`` parser of :class:`LitDofCLI` that parses and stops: nothing is instantiated (no trainer,
    no model, no data), no seed is set."""

    def _set_seed(self) -> None:
        pass

    def _add_instantiators(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


def parse_fit_config(args: list[str]):
    """Parse ``args`` as ``lit-dof fit`` would (the same ``--config`` files and overrides, no subcommand) and
    return the namespace, instantiating nothing.

    Raises:
        SystemExit: a parse error (jsonargparse prints it).
    """
    import warnings

    with warnings.catch_warnings():  # "args and sys.argv both given": plan_main passes sys.argv's tail on purpose
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
        parser_kwargs = {"prog": f"{PROG} plan", "description": COMMANDS["plan"]}
        cli = _ConfigOnlyCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                             subclass_mode_data=True, save_config_callback=None, args=args, run=False,
                             parser_kwargs=parser_kwargs)  # fmt: skip  # packed args
    return cli.config


def plan_main(args: list[str]) -> str:
    """``lit-dof plan``: parse ``args`` as ``lit-dof fit`` would, build the teacher on the meta device and print
    the memory plan (:mod:`lit_dof.pipeline.plan`).

    Returns:
        the printed plan; its last line is ``plan peak_gpu_gib=<x> host_gib=<y>``.

    Raises:
        SystemExit: a parse error, or a :class:`~lit_dof.pipeline.plan.PlanError` (message on stderr, code 2).
    """
    import sys

    from lit_dof.pipeline.plan import PlanError
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
