"""Evaluation: the paper's seven zero-shot tasks through lm-eval, sliding-window perplexity and the per-task
fine-tuning protocol (the comparison runner that uses them is :mod:`lit_dof.comparison`).

* :mod:`~lit_dof.evaluation.task_data` — readers for the original task files (counts as SOURCES.md);
* :mod:`~lit_dof.evaluation.harness` — ``evaluate_model`` (lm-eval ``HFLM`` around a loaded model);
* :mod:`~lit_dof.evaluation.cli` — ``lit-dof eval``;
* :mod:`~lit_dof.evaluation.lm_eval_model` — the lm-eval model ``lit_dof`` and ``lit-dof lm-eval`` (lm-eval's CLI);
* :mod:`~lit_dof.evaluation.extra` — ``require_lm_eval``: lm-eval is the optional ``eval`` extra;
* :mod:`~lit_dof.evaluation.perplexity` — sliding-window perplexity (torchmetrics) on a split of the corpus (test
  by default, :mod:`lit_dof.data.splits`);
* :mod:`~lit_dof.evaluation.position_perplexity` — perplexity by token position, paired ratios, long contexts;
  :mod:`~lit_dof.evaluation.position_report` — their markdown tables;
* :mod:`~lit_dof.evaluation.long_documents` — whole long documents by in-document position, SE over documents;
* :mod:`~lit_dof.evaluation.retrieval_data` and :mod:`~lit_dof.evaluation.needles` — retrieval examples beyond the
  window (passkey, needle-in-a-haystack, associative recall); :mod:`~lit_dof.evaluation.retrieval` — their scores;
* :mod:`~lit_dof.evaluation.controls` — the controls a student is shown beside;
* :mod:`~lit_dof.evaluation.request_cache` — the answered requests of an evaluation, for resuming;
* :mod:`~lit_dof.evaluation.multiple_choice` — option scores as lm-eval's ``multiple_choice`` (acc, acc_norm);
* :mod:`~lit_dof.evaluation.finetune_splits` — each task's train, choose and report documents for fine-tuning;
* :mod:`~lit_dof.evaluation.finetune_data` — ``MultipleChoiceDataModule`` (one task's splits, batched);
* :mod:`~lit_dof.evaluation.finetune` — ``TaskFinetuning``, the per-task fine-tuning phase (METHOD.md §4);
* :mod:`~lit_dof.evaluation.stats` — the paired-difference statistic;
* :mod:`~lit_dof.evaluation.loading` — ``load_model`` (an exported student or any teacher source).

Submodules import lm-eval (``pip install 'lit-dof[eval]'``) and Lightning lazily; importing this package is
cheap, and works without lm-eval.
"""
