"""The data of per-task fine-tuning (:mod:`lit_dof.evaluation.finetune`): one multiple-choice task's train,
choose and report splits (:mod:`lit_dof.evaluation.finetune_splits`), batched with every option of each document
(:func:`~lit_dof.evaluation.multiple_choice.collate_choices`).
"""

from __future__ import annotations

import os

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_dof.evaluation.finetune_splits import check_protocol_task, protocol_splits
from lit_dof.evaluation.multiple_choice import collate_choices
from lit_dof.pipeline.validation import check_number
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.loading import load_tokenizer


class MultipleChoiceDataModule(L.LightningDataModule):
    """The train, choose and report documents of one task (lit_dof.evaluation.finetune_splits): Lightning's
    training loader and its two validation loaders (choose, report).

    Args:
        task: a task with fine-tuning data offline: ``piqa``, ``arc_easy``, ``arc_challenge``, ``winogrande``,
            ``logiqa`` or ``mmlu`` (lit_dof.evaluation.finetune_splits.PROTOCOL_TASKS).
        data_dir: folder in the task data layout (docs/usage.md; default ``$LIT_DOF_DATA``).
        tokenizer: tokenizer source (linked from ``model.teacher`` by the CLI).
        batch_size: documents per batch (each brings all its options).
        seq_len: longest context + option pair in tokens.
        train_limit: use only the first this-many documents of the train split (``None``: all).
        choose_limit: use only the first this-many documents of the choose split.
        report_limit: use only the first this-many documents of the report split.
        mmlu_per_subject: report subset for MMLU: the first this-many test questions of each subject.
        seed: seed of the loaders' shuffling.

    Raises:
        ValueError: a task without fine-tuning data, or a limit below 1 (at construction); FileNotFoundError: missing
            files (at ``setup``).
    """

    def __init__(
        self,
        task: str = "arc_easy",
        data_dir: str | None = None,
        tokenizer: str = DEFAULT_TEACHER,
        batch_size: int = 4,
        seq_len: int = 512,
        train_limit: int | None = None,
        choose_limit: int | None = None,
        report_limit: int | None = None,
        mmlu_per_subject: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_protocol_task(task)
        for name, limit in (
            ("train_limit", train_limit),
            ("choose_limit", choose_limit),
            ("report_limit", report_limit),
        ):
            if limit is not None:
                check_number(name, limit, minimum=1, integer=True, option="--data.init_args.", example=300)
        self.task, self.tokenizer_name, self.batch_size, self.seq_len = task, tokenizer, batch_size, seq_len
        self.data_dir = data_dir or os.environ.get("LIT_DOF_DATA")
        self.train_limit, self.choose_limit, self.report_limit = train_limit, choose_limit, report_limit
        self.mmlu_per_subject, self.seed = mmlu_per_subject, seed
        self.tokenizer = None

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and the task's train, choose and report documents (limits applied).

        Raises:
            FileNotFoundError: no ``data_dir`` and no ``$LIT_DOF_DATA``.
        """
        if not self.data_dir:
            raise FileNotFoundError("no task data: pass data.init_args.data_dir or set LIT_DOF_DATA")
        self.tokenizer = self.tokenizer or load_tokenizer(self.tokenizer_name)
        splits = protocol_splits(self.task, self.data_dir, self.mmlu_per_subject)
        self.train_docs = splits.train[: self.train_limit]
        self.choose_docs = splits.choose[: self.choose_limit]
        self.report_docs = splits.report[: self.report_limit]

    def _loader(self, docs, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            docs,
            batch_size=self.batch_size,
            shuffle=shuffle,
            generator=generator,
            collate_fn=lambda b: collate_choices(b, self.tokenizer, self.seq_len),
        )

    def train_dataloader(self) -> DataLoader:
        """Training documents, shuffled with the seeded generator, every option of a document in one batch."""
        return self._loader(self.train_docs, shuffle=True)

    def val_dataloader(self) -> list[DataLoader]:
        """``[choose, report]``: both splits in order, every option of a document in one batch (the epoch is chosen
        on the first; the second is measured alongside, never chosen on)."""
        return [self._loader(self.choose_docs, shuffle=False), self._loader(self.report_docs, shuffle=False)]
