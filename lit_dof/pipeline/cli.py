"""The ``lit-dof`` command: a LightningCLI with the DoF callbacks and linked data/model arguments.

    lit-dof fit --config configs/quickstart.yaml
    lit-dof fit --config configs/models/smollm2-135m.yaml --config configs/methods/fix.yaml \\
        --config configs/trainer/cpu.yaml
    lit-dof fit --config configs/quickstart.yaml --print_config
    lit-dof eval --model runs/quickstart/version_0/student --data_dir ../shared/data   (lit_dof.evaluation.cli)
    lit-dof compare --rows '[teacher, performer, fix, dof]'   (lit_dof.comparison.cli)
    lit-dof hybrid --bank runs/hybrid/twins/version_0/student --task arc_easy   (lit_dof.hybrid.cli)
    lit-dof plan --config configs/models/llama-3-8b.yaml --config configs/trainer/fsdp.yaml --trainer.devices 8
        (memory per GPU and host RAM per rank, per phase, from the meta-device model: lit_dof.pipeline.plan)

Top-level groups besides LightningCLI's: ``dof:`` (:class:`~lit_dof.pipeline.callbacks.DoFEstimator`) and
``allocator:`` (:class:`~lit_dof.pipeline.callbacks.FeatureDimAllocator`) — always-present callbacks, so
method files override a few keys instead of restating the trainer's callback list. ``model.teacher`` is
linked to ``data.tokenizer`` and ``data.seq_len`` to ``model.seq_len``.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_dof.pipeline.callbacks import DoFEstimator, FeatureDimAllocator
import lightning as L


class LitDofCLI(LightningCLI):
    """LightningCLI for lit-dof phases (any phase LightningModule via ``model.class_path``: the student
    phases, or :class:`~lit_dof.pipeline.capture.TeacherCapture` for ``predict``)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(DoFEstimator, "dof")
        parser.add_lightning_class_args(FeatureDimAllocator, "allocator")
        parser.link_arguments("model.init_args.teacher", "data.init_args.tokenizer")
        parser.link_arguments("data.init_args.seq_len", "model.init_args.seq_len")


def build_cli(args=None, run: bool = True) -> LitDofCLI:
    """Parse ``args`` (default: ``sys.argv``) and, with ``run``, execute the subcommand."""
    return LitDofCLI(
        L.LightningModule,
        L.LightningDataModule,  # WikipediaDataModule, or MultipleChoiceDataModule for task fine-tuning
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
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
        cli = _ConfigOnlyCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                             subclass_mode_data=True, save_config_callback=None, args=args, run=False)  # fmt: skip
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


def main() -> None:
    """Entry point of the ``lit-dof`` console script: ``lit-dof eval ...`` runs the lm-eval evaluation
    (:mod:`lit_dof.evaluation.cli`), ``lit-dof compare ...`` the comparison runner
    (:mod:`lit_dof.comparison.cli`), ``lit-dof hybrid ...`` the hybrid search (:mod:`lit_dof.hybrid.cli`),
    ``lit-dof plan ...`` the memory plan (:func:`plan_main`), every other subcommand is LightningCLI's. The process
    keeps freed tensor memory instead of unmapping it (:func:`~lit_dof.runtime.tune_cpu_allocator`) unless
    ``LIT_DOF_TUNE_ALLOCATOR=0``."""
    import os
    import sys

    from lit_dof.runtime import tune_cpu_allocator

    if os.environ.get("LIT_DOF_TUNE_ALLOCATOR", "1") != "0":
        tune_cpu_allocator()
    if len(sys.argv) > 1 and sys.argv[1] == "eval":
        from lit_dof.evaluation.cli import main as eval_main

        eval_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "compare":
        from lit_dof.comparison.cli import main as compare_main

        compare_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "hybrid":
        from lit_dof.hybrid.cli import main as hybrid_main

        hybrid_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "plan":
        plan_main(sys.argv[2:])
        return
    build_cli()


if __name__ == "__main__":
    main()
