"""Teachers: loading pretrained causal LMs (hub, directory, GGUF, the embedded default's file), their supported
families, random-initialised and FSDP2-sharded teachers, and capture of queries and keys.

The default teacher's name lives here, in a module that imports nothing, so that command modules can show it as
their default without importing torch or transformers.
"""

DEFAULT_TEACHER = "smollm2-135m-instruct"
"""The embedded default teacher (SmolLM2-135M-Instruct, :mod:`lit_dof.teacher.loading`); every command's default."""

EMBEDDED_HUB_SOURCES: dict[str, tuple[str, str]] = {
    DEFAULT_TEACHER: ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
    "gemma3-270m": ("google/gemma-3-270m", "gemma"),
}
"""Embedded alias → (the hub model its GGUF file was made from, that model's license): what a student's model card
names as its ``base_model`` and ``license``."""

__all__ = ["DEFAULT_TEACHER", "EMBEDDED_HUB_SOURCES"]
