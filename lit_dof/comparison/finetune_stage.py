"""The paper's per-task fine-tuning protocol as a comparison stage (METHOD.md §4): a learning rate chosen on the
teacher from a grid — by its accuracy on the task's choosing split, never the reported one
(:mod:`lit_dof.evaluation.finetune_splits`) —, then every cell's model fine-tuned on each task at that rate, each run
a ``lit-dof fit`` subprocess in its own folder. Mixed into :class:`~lit_dof.comparison.cells.Comparison`, whose
settings it reads."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from lit_dof.comparison.rows import REPO_CONFIGS, Row
from lit_dof.comparison.runner import run_logged
from lit_dof.io import atomic_write_json, portable


class FinetuneProtocol:
    """The ``finetune`` stage: the teacher's learning-rate search and each cell's fine-tuning runs."""

    def _finetune_run(self, source: str, task: str, lr: float, folder: Path) -> dict:
        """One fine-tuning fit (subprocess, in ``folder``); returns its ``finetune.json``."""
        result_path = folder / "result.json"
        if result_path.is_file():
            return json.loads(result_path.read_text())
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "lit_dof",
            "fit",
            "--config",
            str(REPO_CONFIGS / "finetune" / "arc_easy.yaml"),
            f"--data.init_args.task={task}",
            f"--model.init_args.teacher={source}",
            f"--model.init_args.lr={lr}",
        ]
        if self.data_dir:
            command.append(f"--data.init_args.data_dir={self.data_dir}")
        if task == "mmlu":  # the paper: MMLU 1 epoch, last
            command += ["--trainer.max_epochs=1", "--model.init_args.selection=last"]
            if self.mmlu_per_subject:
                command.append(f"--data.init_args.mmlu_per_subject={self.mmlu_per_subject}")
        command += [*self.accelerator_args(), *self.finetune_args]
        start = time.time()
        run_logged(command, folder, f"fine-tuning {source} on {task} (lr {lr})")
        summaries = sorted(folder.glob("runs/*/version_*/finetune.json"), key=os.path.getmtime)
        result = {
            **json.loads(summaries[-1].read_text()),
            "wall_seconds": time.time() - start,
            "command": portable(command),
        }
        atomic_write_json(result_path, result)
        return result

    def finetune_lr(self, task: str) -> float:
        """The protocol's learning rate for ``task``: the one of :attr:`finetune_lrs` whose chosen epoch scores best on
        the teacher's choosing split (the smallest on ties).

        Args:
            task: a task with training data.

        Returns:
            The selected learning rate (also written to ``finetune_lr/<task>/selected.json``).

        Raises:
            ValueError: a finished run of the grid without a choose-split score (names its folder).
        """
        folder = Path(self.out) / "finetune_lr" / task
        scores = {}
        for lr in self.finetune_lrs:
            run = self._finetune_run(self.teacher_source(), task, lr, folder / f"lr{lr:g}")
            if run.get("choose_score") is None:
                raise ValueError(
                    f"{folder / f'lr{lr:g}' / 'result.json'} has no choose-split score (written before the protocol "
                    "chose on its own split): delete that folder to run it again"
                )
            scores[lr] = run["choose_score"]
        best = max(sorted(scores), key=lambda lr: scores[lr])
        atomic_write_json(
            folder / "selected.json", {"task": task, "scores": {f"{k:g}": v for k, v in scores.items()}, "lr": best}
        )
        return best

    def finetune(self, row: Row, budget: int, task: str) -> dict:
        """Fine-tune the cell's model on ``task`` at the teacher-selected learning rate (``finetune/<task>.json``).

        Args:
            row: the cell's row.
            budget: its feature budget C.
            task: a task with training data.

        Returns:
            ``finetune/<task>.json``'s content.
        """
        path = self.cell_dir(row, budget) / "finetune" / f"{task}.json"
        if path.is_file():
            return json.loads(path.read_text())
        lr = self.finetune_lr(task)
        if row.kind == "teacher":
            result = self._finetune_run(
                self.teacher_source(), task, lr, Path(self.out) / "finetune_lr" / task / f"lr{lr:g}"
            )
        else:
            result = self._finetune_run(self.model_source(row, budget), task, lr, path.parent / task)
        atomic_write_json(path, result)
        return result
