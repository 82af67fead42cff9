"""The paper's evaluation protocol (METHOD.md §4) as a Lightning phase: per-task fine-tuning of a teacher or
a student on a multiple-choice task, validated by accuracy every epoch.

Every example is scored the way zero-shot evaluation scores it (lm-eval's ``multiple_choice``): each option
is a continuation of the prompt (or, for partial-evaluation tasks, the shared continuation after each
option-filled context), and its score is the summed log-probability of the continuation tokens. Training
minimises the cross-entropy of the gold option under the softmax over the option scores; validation
reports ``acc`` (argmax of the scores) and ``acc_norm`` (argmax of score / continuation length in
characters, as lm-eval). The paper fine-tunes 3 epochs and reports the best epoch (MMLU: 1 epoch, the last):
:class:`TaskFinetuning` records every epoch's accuracy and writes ``finetune.json`` with ``best`` and
``last`` at the end of ``fit``.

    lit-dof fit --config configs/finetune/arc_easy.yaml --model.init_args.teacher runs/.../student
"""

from __future__ import annotations

import os
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_dof.evaluation import task_data
from lit_dof.teacher import DEFAULT_TEACHER

Trainable = Literal["all", "attention", "feature_maps"]


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's causal split: trailing context spaces move to the continuation, whose tokens are the tail of
    the joint encoding after the context's own encoding."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tokenizer(context)["input_ids"]
    return context_ids, tokenizer(context + continuation)["input_ids"][len(context_ids) :]


def option_pairs(doc: dict) -> list[tuple[str, str]]:
    """(context, continuation) per option: ``query`` + " " + choice, or each context + " " + continuation."""
    if "choices" in doc:
        return [(doc["query"], " " + choice) for choice in doc["choices"]]
    return [(context, " " + doc["continuation"]) for context in doc["contexts"]]


def collate_choices(docs: list[dict], tokenizer, max_length: int) -> dict:
    """Batch every option of ``docs``: ``input_ids``/``targets`` ``(P, T)`` (targets −100 outside the
    continuation), ``doc_index``/``option_index`` ``(P,)``, ``gold`` ``(D,)``, ``lengths`` ``(P,)`` (characters
    of each continuation, for acc_norm). Over-long pairs keep their last ``max_length`` tokens."""
    rows, targets, doc_index, option_index, lengths = [], [], [], [], []
    for d, doc in enumerate(docs):
        for o, (context, continuation) in enumerate(option_pairs(doc)):
            context_ids, continuation_ids = encode_pair(tokenizer, context, continuation)
            ids = (context_ids + continuation_ids)[-max_length:]
            n = min(len(continuation_ids), len(ids) - 1)
            rows.append(ids)
            targets.append([-100] * (len(ids) - n) + ids[len(ids) - n :])
            doc_index.append(d)
            option_index.append(o)
            lengths.append(len(continuation.strip()))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "targets": torch.tensor([t + [-100] * (width - len(t)) for t in targets]),
        "doc_index": torch.tensor(doc_index), "option_index": torch.tensor(option_index),
        "gold": torch.tensor([doc["gold"] for doc in docs]), "lengths": torch.tensor(lengths, dtype=torch.float),
    }  # fmt: skip


def option_scores(model, batch: dict) -> torch.Tensor:
    """Summed log p(continuation) per option ``(P,)`` (right padding: causal, so padding never leaks in)."""
    return option_scores_from_logits(model(batch["input_ids"], use_cache=False).logits, batch)


def option_scores_from_logits(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """:func:`option_scores` from already computed logits ``(P, T, V)``."""
    logits = logits[:, :-1].float()
    targets = batch["targets"][:, 1:]
    logprobs = logits.log_softmax(-1).gather(-1, targets.clamp_min(0)[..., None])[..., 0]
    return (logprobs * (targets != -100)).sum(-1)


def score_matrix(scores: torch.Tensor, batch: dict) -> torch.Tensor:
    """``(D, max options)`` option scores, −inf where a document has fewer options."""
    D = len(batch["gold"])
    width = int(batch["option_index"].max()) + 1
    matrix = torch.full((D, width), float("-inf"), dtype=scores.dtype, device=scores.device)
    matrix[batch["doc_index"], batch["option_index"]] = scores
    return matrix


class MultipleChoiceDataModule(L.LightningDataModule):
    """Training split and evaluation split of one task (:mod:`lit_dof.evaluation.task_data`).

    Args:
        task: one of :data:`~lit_dof.evaluation.task_data.TRAIN_SPLITS`.
        data_dir: folder laid out like ../shared/data (default ``$LIT_DOF_DATA``).
        tokenizer: tokenizer source (linked from ``model.teacher`` by the CLI).
        batch_size: documents per batch (each brings all its options). seq_len: longest pair in tokens.
        train_limit, eval_limit: use only the first this-many documents of each split.
        mmlu_per_subject: evaluation subset for MMLU (see :func:`~lit_dof.evaluation.task_data.mmlu`).

    Raises:
        ValueError: a task without training data; FileNotFoundError: missing files.
    """

    def __init__(self, task: str = "arc_easy", data_dir: str | None = None, tokenizer: str = DEFAULT_TEACHER,
                 batch_size: int = 4, seq_len: int = 512, train_limit: int | None = None,
                 eval_limit: int | None = None, mmlu_per_subject: int | None = None, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.task, self.tokenizer_name, self.batch_size, self.seq_len = task, tokenizer, batch_size, seq_len
        self.data_dir = data_dir or os.environ.get("LIT_DOF_DATA")
        self.train_limit, self.eval_limit, self.mmlu_per_subject, self.seed = train_limit, eval_limit, mmlu_per_subject, seed
        self.tokenizer = None

    def setup(self, stage: str | None = None) -> None:
        from lit_dof.teacher.loading import load_tokenizer

        if not self.data_dir:
            raise FileNotFoundError("no task data: pass data.init_args.data_dir or set LIT_DOF_DATA")
        self.tokenizer = self.tokenizer or load_tokenizer(self.tokenizer_name)
        options = {"per_subject": self.mmlu_per_subject} if self.task == "mmlu" else {}
        self.train_docs = task_data.load_train_split(self.task, self.data_dir)[: self.train_limit]
        self.eval_docs = task_data.load_task(self.task, self.data_dir, **options)[: self.eval_limit]

    def _loader(self, docs, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(docs, batch_size=self.batch_size, shuffle=shuffle, generator=generator,
                          collate_fn=lambda b: collate_choices(b, self.tokenizer, self.seq_len))  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_docs, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.eval_docs, shuffle=False)


class TaskFinetuning(L.LightningModule):
    """Fine-tune a teacher or an exported student on one multiple-choice task (METHOD.md §4).

    Args:
        teacher: the model to fine-tune: a teacher source or an exported student directory (named
            ``teacher`` so the CLI links it to the data module's tokenizer).
        trainable: ``"all"`` (the paper's full fine-tuning), ``"attention"`` (attention blocks, linear twins
            included) or ``"feature_maps"`` (only φ of a student).
        lr, weight_decay, warmup_steps: AdamW with linear warm-up, then constant.
        seq_len: linked from the data module.
        selection: ``"best"`` (paper: best epoch) or ``"last"`` (paper's MMLU rule) — what ``finetune.json``
            reports as ``score``.

    Raises:
        ValueError: unknown ``trainable``/``selection``, or nothing to train.
    """

    def __init__(self, teacher: str = DEFAULT_TEACHER, trainable: Trainable = "all", lr: float = 1e-5,
                 weight_decay: float = 0.0, warmup_steps: int = 10, seq_len: int = 512,
                 selection: Literal["best", "last"] = "best") -> None:  # fmt: skip
        super().__init__()
        if trainable not in ("all", "attention", "feature_maps"):
            raise ValueError(f"trainable must be 'all', 'attention' or 'feature_maps', got {trainable!r}")
        if selection not in ("best", "last"):
            raise ValueError(f"selection must be 'best' or 'last', got {selection!r}")
        self.save_hyperparameters()
        self.teacher_name, self.trainable, self.lr, self.weight_decay = teacher, trainable, lr, weight_decay
        self.warmup_steps, self.seq_len, self.selection = warmup_steps, seq_len, selection
        self.model = None
        self.history: list[dict] = []
        self._sums = torch.zeros(3)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from lit_dof.evaluation.loading import load_model

        self.model, _ = load_model(self.teacher_name)
        self.model.requires_grad_(False)
        names = [n for n, _ in self.model.named_parameters()]
        if self.trainable == "all":
            chosen = names
        elif self.trainable == "feature_maps":
            chosen = [n for n in names if ".lit_dof.linear." in n]  # the twins: feature maps, far-term weights
        else:
            chosen = [n for n in names if ".self_attn." in n or ".attn." in n or ".attention." in n]
        if not chosen:
            raise ValueError(f"trainable={self.trainable!r} selects no parameter of {self.teacher_name}")
        params = dict(self.model.named_parameters())
        for name in chosen:
            params[name].requires_grad_(True)
        self.model.train()  # from_pretrained returns eval mode; dropout (if any) belongs to fine-tuning

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        matrix = score_matrix(option_scores(self.model, batch), batch)
        loss = torch.nn.functional.cross_entropy(matrix, batch["gold"])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite fine-tuning loss at step {self.global_step}; lower the learning rate")
        self.log("train/loss", loss.detach(), prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._sums = torch.zeros(3)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        scores = option_scores(self.model, batch)
        matrix = score_matrix(scores, batch)
        normed = score_matrix(scores / batch["lengths"].clamp_min(1), batch)
        gold = batch["gold"]
        self._sums += torch.tensor([float((matrix.argmax(-1) == gold).sum()), float((normed.argmax(-1) == gold).sum()),
                                    float(len(gold))])  # fmt: skip

    def on_validation_epoch_end(self) -> None:
        sums = self._sums.to(self.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
        acc, acc_norm = (sums[:2] / sums[2].clamp_min(1)).tolist()
        self.log("val/acc", acc, prog_bar=True)
        self.log("val/acc_norm", acc_norm)
        if not self.trainer.sanity_checking:
            self.history.append({"epoch": self.current_epoch, "step": self.global_step, "acc": acc, "acc_norm": acc_norm,
                                 "examples": int(sums[2])})  # fmt: skip

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        warmup = max(1, self.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def summary(self) -> dict:
        """``{"history", "best", "last", "score", "selection"}`` over the validated epochs."""
        best = max(self.history, key=lambda h: h["acc"]) if self.history else None
        last = self.history[-1] if self.history else None
        chosen = best if self.selection == "best" else last
        return {"history": self.history, "best": best, "last": last, "selection": self.selection,
                "score": chosen["acc"] if chosen else None, "lr": self.lr, "trainable": self.trainable,
                "model": self.teacher_name}  # fmt: skip

    def on_fit_end(self) -> None:
        from lit_dof.io import atomic_write_json

        log_dir = self.trainer.log_dir
        if self.trainer.is_global_zero and log_dir:
            atomic_write_json(os.path.join(log_dir, "finetune.json"), self.summary())
