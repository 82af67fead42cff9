"""lit-dof: distil the softmax attention of a pretrained causal Transformer into linear attention whose
per-layer feature dimension follows the degrees of freedom of its attention kernel.

The pipeline, one subpackage per stage: :mod:`lit_dof.teacher` (loading, capture) → :mod:`lit_dof.dof`
(Algorithm 1) → :mod:`lit_dof.students` (surgery, student model, generation cache) → :mod:`lit_dof.pipeline`
(Lightning phases, ``lit-dof``) → :mod:`lit_dof.evaluation` (lm-eval tasks, perplexity, fine-tuning
protocol) → :mod:`lit_dof.comparison` (the comparison runner, ``lit-dof compare``), with :mod:`lit_dof.hybrid`
(softmax/linear hybrids, ``lit-dof hybrid``) and :mod:`lit_dof.data` (corpora, splits); the math lives in
:mod:`lit_dof.attention` (pure PyTorch). The top-level names below are imported lazily so that
``import lit_dof.attention`` does not pull in transformers. ``import lit_dof`` registers the ``"lit_dof"``
model type with ``AutoConfig`` / ``AutoModelForCausalLM`` as soon as transformers is imported
(:mod:`lit_dof._auto_registration`), so ``AutoModelForCausalLM.from_pretrained(student_dir)`` works.
"""

from __future__ import annotations

import importlib

from lit_dof._auto_registration import register_with_transformers

__version__ = "0.1.0"

_LAZY = {
    "load_teacher": "lit_dof.teacher.loading",
    "capture_attention": "lit_dof.teacher.capture",
    "capture_batch": "lit_dof.teacher.capture",
    "estimate_model_dof": "lit_dof.dof.report",
    "DoFReport": "lit_dof.dof.report",
    "linearize": "lit_dof.students.modeling",
    "load_student": "lit_dof.students.modeling",
    "LitDofConfig": "lit_dof.students.modeling",
    "LitDofForCausalLM": "lit_dof.students.modeling",
    "register_feature_map": "lit_dof.attention",
    "evaluate_model": "lit_dof.evaluation.harness",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_dof' has no attribute {name!r}")


register_with_transformers()
