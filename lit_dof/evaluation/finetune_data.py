"""The data of per-task fine-tuning (:mod:`lit_dof.evaluation.finetune`): one multiple-choice task's training
and evaluation splits (:mod:`lit_dof.evaluation.task_data`), batched with every option of each document
(:func:`~lit_dof.evaluation.multiple_choice.collate_choices`).
"""

from __future__ import annotations

import os

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_dof.evaluation import task_data
from lit_dof.evaluation.multiple_choice import collate_choices
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.loading import load_tokenizer


class MultipleChoiceDataModule(L.LightningDataModule):
    """Training split and evaluation split of one task (read by lit_dof.evaluation.task_data).

    Args:
        task: a task with training data offline: ``arc_easy``, ``arc_challenge``, ``winogrande``, ``logiqa`` or
            ``mmlu`` (lit_dof.evaluation.task_data.TRAIN_SPLITS).
        data_dir: folder in the task data layout (docs/usage.md; default ``$LIT_DOF_DATA``).
        tokenizer: tokenizer source (linked from ``model.teacher`` by the CLI).
        batch_size: documents per batch (each brings all its options).
        seq_len: longest context + option pair in tokens.
        train_limit: use only the first this-many documents of the training split.
        eval_limit: use only the first this-many documents of the evaluation split.
        mmlu_per_subject: evaluation subset for MMLU: the first this-many questions of each subject.
        seed: seed of the loaders' shuffling.

    Raises:
        ValueError: a task without training data; FileNotFoundError: missing files.
    """

    def __init__(
        self,
        task: str = "arc_easy",
        data_dir: str | None = None,
        tokenizer: str = DEFAULT_TEACHER,
        batch_size: int = 4,
        seq_len: int = 512,
        train_limit: int | None = None,
        eval_limit: int | None = None,
        mmlu_per_subject: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.task, self.tokenizer_name, self.batch_size, self.seq_len = task, tokenizer, batch_size, seq_len
        self.data_dir = data_dir or os.environ.get("LIT_DOF_DATA")
        self.train_limit, self.eval_limit = train_limit, eval_limit
        self.mmlu_per_subject, self.seed = mmlu_per_subject, seed
        self.tokenizer = None

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and the task's training and evaluation documents (limits applied).

        Raises:
            FileNotFoundError: no ``data_dir`` and no ``$LIT_DOF_DATA``.
        """
        if not self.data_dir:
            raise FileNotFoundError("no task data: pass data.init_args.data_dir or set LIT_DOF_DATA")
        self.tokenizer = self.tokenizer or load_tokenizer(self.tokenizer_name)
        options = {"per_subject": self.mmlu_per_subject} if self.task == "mmlu" else {}
        self.train_docs = task_data.load_train_split(self.task, self.data_dir)[: self.train_limit]
        self.eval_docs = task_data.load_task(self.task, self.data_dir, **options)[: self.eval_limit]

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

    def val_dataloader(self) -> DataLoader:
        """Evaluation documents in order, every option of a document in one batch."""
        return self._loader(self.eval_docs, shuffle=False)
