"""Teachers: loading pretrained causal LMs, their supported families, and capture of queries and keys.

The default teacher's name lives here, in a module that imports nothing, so that command modules can show it as
their default without importing torch or transformers.
"""

DEFAULT_TEACHER = "smollm2-135m-instruct"
"""The embedded default teacher (SmolLM2-135M-Instruct, :mod:`lit_dof.teacher.loading`); every command's default."""

__all__ = ["DEFAULT_TEACHER"]
