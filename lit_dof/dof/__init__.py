"""Degrees of freedom (paper Algorithm 1; METHOD.md §2).

* :mod:`lit_dof.dof.estimator` — N_λ of a head from J pooled vectors (exact, well-conditioned), the
  ridge rules and the feature-dimension allocation;
* :mod:`lit_dof.dof.report` — the whole model: capture → DoF → allocation → :class:`DoFReport` (JSON);
* :mod:`lit_dof.dof.sharded` — the per-layer DoF computation split across the ranks of a process group.
"""

from lit_dof.dof.estimator import (
    STRATEGIES,
    DegenerateAllocationWarning,
    RelativeTo,
    Strategy,
    allocate_feature_dims,
    allocate_head_feature_dims,
    degrees_of_freedom,
    dof_eigvalsh,
    layer_dof,
    log_gram,
    select_lambda,
)
from lit_dof.dof.report import DoFReport, collect_samples, dof_report, estimate_model_dof

__all__ = [
    "STRATEGIES",
    "DegenerateAllocationWarning",
    "DoFReport",
    "RelativeTo",
    "Strategy",
    "allocate_feature_dims",
    "allocate_head_feature_dims",
    "collect_samples",
    "degrees_of_freedom",
    "dof_eigvalsh",
    "dof_report",
    "estimate_model_dof",
    "layer_dof",
    "log_gram",
    "select_lambda",
]
