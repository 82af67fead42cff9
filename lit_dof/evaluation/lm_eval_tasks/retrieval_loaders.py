"""lm-eval hooks of the retrieval tasks beside this file (``lit_dof_<task>``: greedy generation, exact match;
``lit_dof_<task>_ll``: the answer's log-likelihood and whether it is the greedy continuation).

Each ``custom_dataset`` hook makes the examples of :mod:`lit_dof.evaluation.retrieval_data` with the model's own
tokenizer, named by the task metadata ``tokenizer`` (``lit-dof eval`` passes it; under ``lm_eval --model hf`` the
``pretrained`` model argument, or ``--metadata '{"tokenizer": …}'``), for the metadata's ``retrieval_contexts``,
``retrieval_depths``, ``retrieval_trials``, ``retrieval_seed`` and the model's ``max_length`` (contexts beyond it
are dropped).
"""

import datasets

from lit_dof.evaluation import retrieval, retrieval_data


def _dataset(task: str, metadata: dict) -> dict:
    name = metadata.get("tokenizer") or metadata.get("pretrained")
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"retrieval task {task} sizes its prompts with the model's tokenizer: pass it as task metadata "
            "(lit-dof eval does; lm_eval --model hf --model_args pretrained=… or --metadata '{\"tokenizer\": …}')"
        )
    from lit_dof.teacher.loading import load_tokenizer

    options = {
        "contexts": metadata.get("retrieval_contexts") or retrieval_data.CONTEXTS,
        "depths": metadata.get("retrieval_depths") or retrieval_data.DEPTHS,
        "trials": int(metadata.get("retrieval_trials") or 4),
        "seed": int(metadata.get("retrieval_seed") or 0),
        "max_length": metadata.get("max_length"),
    }
    docs = retrieval_data.examples(task, load_tokenizer(name), **options)
    return {"test": datasets.Dataset.from_list([doc.to_dict() for doc in docs])}


def _hook(task: str):
    def load(**metadata):
        return _dataset(task, metadata)

    load.__name__ = task
    return load


def score(doc: dict, results: list[str]) -> dict:
    """``process_results`` of the generation tasks: :func:`lit_dof.evaluation.retrieval.score_generation`."""
    return retrieval.score_generation(doc["answers"], results[0])


# One hook per task, named as the YAMLs reference them (``!function retrieval_loaders.<task>``).
passkey, niah_single, niah_uuid, niah_multikey, niah_multivalue, niah_multiquery, assoc_recall = map(
    _hook, retrieval_data.GENERATORS
)
