"""lm-eval ``custom_dataset`` hooks for the task YAMLs beside this file (loaded by lm-eval from its path).

lm-eval calls each hook with the task's metadata (merged with ``TaskManager(metadata=...)``); the keys read
here are ``data_dir`` (default: ``$LIT_DOF_DATA``) and ``mmlu_per_subject``. Records come from
:mod:`lit_dof.evaluation.task_data`.
"""

import os

import datasets

from lit_dof.evaluation import task_data


def _dataset(name: str, metadata: dict, **options) -> dict:
    data_dir = metadata.get("data_dir") or os.environ.get("LIT_DOF_DATA")
    if not data_dir:
        raise FileNotFoundError(
            f"task {name}: no data directory; pass data_dir (lit-dof eval --data_dir) or set "
            "LIT_DOF_DATA to a folder in the task data layout (docs/usage.md, 'Task data layout')"
        )
    return {"test": datasets.Dataset.from_list(task_data.load_task(name, data_dir, **options))}


def _hook(name: str):
    def load(**metadata):
        options = {"per_subject": metadata.get("mmlu_per_subject")} if name.startswith("mmlu") else {}
        return _dataset(name, metadata, **options)

    load.__name__ = name
    return load


# One hook per task, named as the YAMLs reference them (``!function loaders.<task>``).
piqa, logiqa, arc_easy, arc_challenge, winogrande, wsc273, mmlu = map(_hook, task_data.TASKS)
(mmlu_5shot,) = map(_hook, task_data.EXTRA_TASKS)
