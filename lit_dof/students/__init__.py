"""Students: linear twins attached to a teacher (surgery), the student model class and its cache (and the bytes its
decode state holds), the layer-wise losses, LoRA, which parameters a phase trains, and a saved student's folder
(config, integrity checks, remote code, model card)."""

from lit_dof.students.cache import RecurrentStateLayer, student_cache
from lit_dof.students.card import write_model_card
from lit_dof.students.modeling import LitDofConfig, LitDofForCausalLM, linearize, load_student
from lit_dof.students.surgery import attach_linear_attention, set_softmax_layers

__all__ = [
    "LitDofConfig",
    "LitDofForCausalLM",
    "RecurrentStateLayer",
    "attach_linear_attention",
    "linearize",
    "load_student",
    "set_softmax_layers",
    "student_cache",
    "write_model_card",
]
