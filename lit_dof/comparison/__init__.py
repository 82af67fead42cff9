"""The comparison runner (``lit-dof compare``): one teacher, one or more feature budgets, every method
trained the same way and evaluated the same way — the paper's Table 3, resumable cell by cell.

A **cell** is (method row, budget, seed). Its directory ``<out>/C<budget>/<row>/`` (seed 0) or
``<out>/C<budget>/seed<s>/<row>/`` holds, each written once and atomically, so a re-run skips whatever is
finished:

* the fit: ``lit-dof fit`` run as a subprocess *in the cell directory* (the base config's relative
  log/checkpoint paths land there; a killed fit resumes with ``--ckpt_path last``); ``fit.json`` records
  its wall time (summed over attempts), steps, tokens seen, dims, λ, J and the validation curve;
* ``eval/<task>.json``: zero-shot lm-eval results per task (:func:`~lit_dof.evaluation.harness.evaluate_model`);
  ``eval/cache``: the answered requests of an unfinished task (a killed task resumes from them);
* ``ppl.json``: sliding-window perplexity on the test split (``--ppl_split validation``: the validation documents, as
  the records measured before the test split; :mod:`lit_dof.data.splits`), perplexity by token position in
  disjoint ``ppl_window`` blocks (``by_position``, buckets 0–63 / 64–255 / 256–511 for 512), and ``state``:
  the bytes of the model's generation cache after a prefill of ``ppl_window`` tokens (one sequence);
* ``long.json`` (stage ``long``): perplexity by position in blocks of 512 to 8192 tokens (long context);
* ``long_documents.json`` (stage ``long_documents``): the long-document test set by in-document position
  (:func:`~lit_dof.evaluation.long_documents.long_document_perplexity`);
* ``retrieval/<task>.json`` and ``<task>.png`` (stage ``retrieval``): retrieval by greedy generation over contexts ×
  needle depths, with the heatmap.

With ``--controls ROW`` the student of ``ROW`` is shown beside its controls (:mod:`lit_dof.evaluation.controls`), each a
row of its own measured by every evaluation stage (:mod:`~lit_dof.comparison.control_cells`: ``control.json`` in
``<student cell>/controls/<name>/``; the controls with the teacher's weights measured once per window and shared).

:func:`~lit_dof.comparison.report.write_report` gathers every finished cell into ``comparison.json``, ``comparison.md``
(methods × tasks, average, perplexity, budget, λ, J, tokens, wall time, and the fraction of the teacher–Performer gap
each method closes) and ``comparison.png``: average accuracy vs total feature budget (one line per method), validation
perplexity vs step, and each curve divided by its reference row's at the same step (the λ study's "has the ranking
stopped changing"). Every row's reference is Fix trained with the same loss (:class:`~lit_dof.comparison.rows.Row`), so
paired differences isolate the allocation. With several ``--seeds`` the report adds each method's mean and spread over
the seeds and its difference from the reference with a standard error over the seeds: one training run cannot tell two
methods apart when the run-to-run spread is as large as their difference.

The report is the durable record: ``comparison.json`` keeps each cell's per-example scores, and a re-render carries over
the cells of the earlier ``comparison.json`` in the report folder whose run directories are gone (``--carry``,
:func:`~lit_dof.comparison.collect.collect`), so a lost scratch folder costs checkpoints, not results.

Modules, one idea each:

* :mod:`~lit_dof.comparison.rows` — the methods (``Row``; the rows are data, ``configs/compare/rows.yaml``), the
  metric per task, the grid of cells;
* :mod:`~lit_dof.comparison.cells` — ``Comparison``: a cell's settings, directory and fit;
* :mod:`~lit_dof.comparison.stages` — the evaluation stages (tasks, retrieval, perplexities);
  :mod:`~lit_dof.comparison.finetune_stage` — the per-task fine-tuning protocol;
* :mod:`~lit_dof.comparison.control_cells` — a student's controls as cells;
* :mod:`~lit_dof.comparison.runner` — one subprocess run in a folder, logged, its exit code checked;
* :mod:`~lit_dof.comparison.cell_records` — a cell's stage records as types (``fit.json``, ``ppl.json``, evaluations,
  ``control.json``, ``fit_attempts.json``); :mod:`~lit_dof.comparison.artefacts` — reading a cell's files;
* :mod:`~lit_dof.comparison.collect` — the report's cells, carried over from an earlier report where gone;
* :mod:`~lit_dof.comparison.summary` — means, paired differences, spread over seeds;
* :mod:`~lit_dof.comparison.records` — ``Report`` and ``Cell``: the report as types, read from every format written;
* :mod:`~lit_dof.comparison.render` — the markdown report; :mod:`~lit_dof.comparison.plots` — its figure;
  :mod:`~lit_dof.comparison.beyond_window` — its retrieval section and the students against their controls over seeds;
* :mod:`~lit_dof.comparison.report` — ``write_report``; :mod:`~lit_dof.comparison.cli` — ``lit-dof compare``.
"""
