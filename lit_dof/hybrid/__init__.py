"""Hybrid softmax/linear models (Distill-then-Replace, arXiv 2601.11667; METHOD.md §6).

* :mod:`~lit_dof.hybrid.search` — the greedy, task-validated replacement search and the orderings that need
  no search (DoF-guided, local-loss-guided, uniform, random), over any scorer of a set of linear layers;
* :mod:`~lit_dof.hybrid.prefix` — the teacher's hidden states cached per depth, and running only the layers
  from the first linear one onwards;
* :mod:`~lit_dof.hybrid.scoring` — ``HybridScorer``: task accuracy or perplexity of a hybrid, prefix-cached.
"""
