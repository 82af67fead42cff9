r"""lm-eval as users run it: the lm-eval model ``lit_dof`` and ``lit-dof lm-eval``, lm-eval's own CLI.

lm-eval finds models in its registry only (it has no entry-point hook for them), so the model must be
registered before lm-eval parses its arguments. Importing this module registers :class:`LitDofLM` as
``lit_dof``; :func:`main` imports it and hands the command line to lm-eval's CLI unchanged::

    lit-dof lm-eval --model lit_dof --model_args pretrained=runs/quickstart/version_0/student,device=cpu \\
        --tasks lit_dof_piqa lit_dof_arc_easy --metadata '{"data_dir": "/path/to/task/data"}' --limit 100
    lit-dof lm-eval ls tasks                 # lm-eval's subcommands too (run, ls, validate)

From Python, ``import lit_dof.evaluation.lm_eval_model`` and then ``lm_eval.simple_evaluate(model="lit_dof",
model_args="pretrained=DIR", ...)``. The shipped ``lit_dof_<task>`` tasks (local files, read from
``data_dir`` in the metadata or ``$LIT_DOF_DATA``) are included unless the command names its own
``--include_path``; lm-eval's built-in tasks are there as with ``lm-eval`` itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lit_dof.evaluation.extra import require_lm_eval

require_lm_eval("the lm-eval model `lit_dof`")  # before lm_eval's imports: the install line, not a traceback

from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

import lit_dof.students  # noqa: E402, F401  (registers the lit_dof config/model with the Auto classes)
from lit_dof.evaluation.harness import TASK_DIR  # noqa: E402
from lit_dof.evaluation.loading import is_student  # noqa: E402
from lit_dof.teacher.loading import resolve_source  # noqa: E402

MODEL_NAME = "lit_dof"
"""The name the model is registered under in lm-eval (``--model lit_dof``)."""

PROG = "lit-dof lm-eval"


@register_model(MODEL_NAME)
class LitDofLM(HFLM):
    """lm-eval's ``HFLM`` for every source ``lit-dof eval`` loads: an exported student (or hybrid) directory,
    a teacher alias (``smollm2-135m-instruct``), a ``.gguf`` file, a transformers directory or a hub id.

    A student directory loads through the ``lit_dof`` Auto classes; an alias or a GGUF file is converted once
    (:func:`~lit_dof.teacher.loading.resolve_source`) and loads from the cached copy. ``dtype="auto"`` (the
    default) is what ``lit-dof eval --dtype auto`` uses: a student's recorded dtype, float32 for a teacher.
    Everything else is ``HFLM``'s (``device``, ``batch_size``, ``max_length``, ``peft`` …).

    Args:
        pretrained: the source, or an already loaded model (passed to ``HFLM`` as it is).
        backend: ``causal`` (a student's ``model_type`` is not in transformers' causal-LM table, so
            ``HFLM``'s ``default`` would guess and warn).
        dtype: ``auto``, or a dtype name / ``torch.dtype`` for the parameters.
        **kwargs: ``HFLM``'s other arguments.

    Raises:
        TeacherNotFoundError: an unknown alias, or a directory without ``config.json``.
    """

    def __init__(self, pretrained, backend: str = "causal", dtype="auto", **kwargs) -> None:
        if isinstance(pretrained, str) and not is_student(pretrained):  # students load through the Auto classes
            pretrained = str(resolve_source(pretrained))
            dtype = "float32" if dtype == "auto" else dtype
        super().__init__(pretrained, backend=backend, dtype=dtype, **kwargs)


def with_shipped_tasks(args: Sequence[str]) -> list[str]:
    """``args`` plus ``--include_path`` of the shipped task YAMLs, unless they name one or only ask for help.

    Args:
        args: an lm-eval command line (without the program name).

    Returns:
        the command line to run.
    """
    args = list(args)
    asks_help = not args or args[0] in ("-h", "--help") or args == ["run"]
    if asks_help or any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        return args
    return [*args, "--include_path", str(TASK_DIR)]


def main(args: Sequence[str] | None = None) -> None:
    """``lit-dof lm-eval ARGS``: lm-eval's CLI (``cli_evaluate``) with ``lit_dof`` registered.

    Args:
        args: lm-eval's arguments (default: the process's, after the program name).

    Raises:
        SystemExit: lm-eval's own exits (``--help``, usage errors).
    """
    from lm_eval.__main__ import cli_evaluate

    argv = with_shipped_tasks(sys.argv[1:] if args is None else args)
    saved = sys.argv
    sys.argv = [PROG, *argv]  # lm-eval reads (and edits) sys.argv itself
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
