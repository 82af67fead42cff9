"""Hybrid softmax/linear models (Distill-then-Replace, arXiv 2601.11667; METHOD.md §6).

* :mod:`~lit_dof.hybrid.search` — the greedy, task-validated replacement search over any scorer of a set of
  linear layers; the direction of a metric (``higher_is_better``) and the ``Tolerance`` that applies it;
* :mod:`~lit_dof.hybrid.orderings` — the orderings that need no search (DoF-guided, local-loss-guided, uniform,
  random) and the counts of linear layers at which they are compared;
* :mod:`~lit_dof.hybrid.prefix` — the teacher's hidden states cached per depth, and running only the layers
  from the first linear one onwards;
* :mod:`~lit_dof.hybrid.scoring` — ``HybridScorer``: task accuracy or perplexity of a hybrid, prefix-cached;
* :mod:`~lit_dof.hybrid.local` — each linear twin's local loss on the target's data;
* :mod:`~lit_dof.hybrid.items` — the search, confirmation and held-out items of a task or a corpus;
* :mod:`~lit_dof.hybrid.bank` — what a bank of twins says about itself (DoF, training recipe);
* :mod:`~lit_dof.hybrid.record` — ``SearchRecord``: the search's record as types, read from every format written;
* :mod:`~lit_dof.hybrid.state` — ``search.json`` on disk, written as soon as a number exists, scores memoised;
* :mod:`~lit_dof.hybrid.settings` — ``SearchSettings``: the settings of ``lit-dof hybrid``, its options;
* :mod:`~lit_dof.hybrid.run` — ``HybridSearch``: those settings and the stages of ``lit-dof hybrid``;
* :mod:`~lit_dof.hybrid.report` — ``hybrid.md``/``.json``/``.png`` from the record;
* :mod:`~lit_dof.hybrid.cli` — ``lit-dof hybrid`` (options and help).
"""
