"""The ``lit-dof`` command: a LightningCLI with the DoF callbacks and linked data/model arguments.

    lit-dof fit --config configs/quickstart.yaml
    lit-dof fit --config configs/models/smollm2-135m.yaml --config configs/methods/fix.yaml \\
        --config configs/trainer/cpu.yaml
    lit-dof fit --config configs/quickstart.yaml --print_config

Top-level groups besides LightningCLI's: ``dof:`` (:class:`~lit_dof.pipeline.callbacks.DoFEstimator`) and
``allocator:`` (:class:`~lit_dof.pipeline.callbacks.FeatureDimAllocator`) — always-present callbacks, so
method files override a few keys instead of restating the trainer's callback list. ``model.teacher`` is
linked to ``data.tokenizer`` and ``data.seq_len`` to ``model.seq_len``.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_dof.data.datamodule import WikipediaDataModule
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
        WikipediaDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


def main() -> None:
    """Entry point of the ``lit-dof`` console script."""
    build_cli()


if __name__ == "__main__":
    main()
