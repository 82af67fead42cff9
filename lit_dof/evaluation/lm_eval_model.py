r"""lm-eval as users run it: the lm-eval model ``lit_dof`` and ``lit-dof lm-eval``, lm-eval's own CLI.

lm-eval finds models in its registry only (lm-eval 0.4 has no entry-point hook for them: its table of model names
is fixed and anything else must be registered by an import), so the model must be registered before lm-eval parses
its arguments. Importing this module registers :class:`LitDofLM` as ``lit_dof``; :func:`main` imports it and hands
the command line to lm-eval's CLI unchanged, after a short preamble on ``--help`` that names the model and lists the
shipped tasks::

    lit-dof lm-eval --model lit_dof --model_args pretrained=runs/quickstart/version_0/student,device=cpu \\
        --tasks lit_dof_piqa lit_dof_arc_easy --metadata '{"data_dir": "/path/to/task/data"}' --limit 100
    lit-dof lm-eval --help

``lit-dof lm-eval ls tasks`` (lm-eval's subcommands ``run``, ``ls``, ``validate`` work too) lists every lm-eval
task, thousands, and takes a minute. Plain ``lm_eval --model lit_dof`` cannot find the model (nothing imports this
module there); plain lm-eval loads a student with its own ``hf`` model instead, through the code files every saved
student carries (:mod:`lit_dof.students.remote_code`)::

    lm_eval --model hf --model_args pretrained=STUDENT,trust_remote_code=True --device cpu --tasks arc_easy

From Python, ``import lit_dof.evaluation.lm_eval_model`` and then ``lm_eval.simple_evaluate(model="lit_dof",
model_args="pretrained=DIR", ...)``. The shipped ``lit_dof_<task>`` tasks (local files, read from
``data_dir`` in the metadata or ``$LIT_DOF_DATA``) are included unless the command names its own
``--include_path``; lm-eval's built-in tasks are there as with ``lm-eval`` itself.
"""

from __future__ import annotations

import re
import sys
import textwrap
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
    Everything else is ``HFLM``'s (``device``, ``batch_size``, ``max_length``, ``peft`` …). ``device`` and
    ``batch_size`` may be given in ``--model_args`` as well as by lm-eval's ``--device`` / ``--batch_size``; the
    ``--model_args`` value wins (:meth:`create_from_arg_obj`).

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

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> LitDofLM:
        """``--model_args`` as a string (``pretrained=DIR,device=cpu``): as :meth:`create_from_arg_obj`.

        Args:
            arg_string: ``key=value`` pairs separated by commas.
            additional_config: lm-eval's own ``batch_size``, ``max_batch_size`` and ``device``.

        Returns:
            the model.
        """
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> LitDofLM:
        """The model from ``--model_args`` and lm-eval's run settings, the former winning where both name a key.

        lm-eval passes ``device`` (default ``cuda:0``), ``batch_size`` and ``max_batch_size`` beside the model
        arguments; ``HFLM``'s own constructor would then get ``device`` twice when ``--model_args`` names it too
        (``TypeError: got multiple values for keyword argument 'device'``).

        Args:
            arg_dict: the parsed ``--model_args``.
            additional_config: lm-eval's run settings; ``None`` values are dropped.

        Returns:
            the model.
        """
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)


def shipped_tasks() -> list[str]:
    """The names of the task YAMLs shipped in :data:`~lit_dof.evaluation.harness.TASK_DIR` (their ``task:`` line).

    Returns:
        the task names, sorted (``lit_dof_arc_challenge``, ``lit_dof_arc_easy``, …).
    """
    names = []
    for path in sorted(TASK_DIR.glob("*.yaml")):
        names += re.findall(r"^task:\s*(\S+)\s*$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return sorted(names)


def help_preamble() -> str:
    """What ``lit-dof lm-eval --help`` prints before lm-eval's own help: the model ``lit_dof``, the shipped tasks,
    an example, and the plain-lm-eval route.

    Returns:
        the text, ending with a blank line.
    """
    tasks = textwrap.fill(" ".join(shipped_tasks()), width=100, initial_indent="  ", subsequent_indent="  ")
    return f"""{PROG}: lm-eval's command line (its own help follows) with lit-dof's model and tasks.

model:
  --model {MODEL_NAME} --model_args pretrained=PATH[,device=cpu][,dtype=auto][,batch_size=N]
      PATH: a lit-dof student folder or any teacher lit-dof loads (alias, .gguf, directory, hub id);
      the other model_args are those of lm-eval's hf model (HFLM).

tasks shipped with lit-dof (added unless the command names its own --include_path; their data are
local files: --metadata '{{"data_dir": DIR}}' or $LIT_DOF_DATA):
{tasks}

example:
  {PROG} --model {MODEL_NAME} --model_args pretrained=STUDENT,device=cpu --tasks lit_dof_piqa \\
      --metadata '{{"data_dir": "/path/to/task/data"}}' --limit 100

plain lm-eval loads a student folder through the folder's own code files (`lm_eval --model {MODEL_NAME}`
is unknown there: lm-eval finds models by import only):
  lm_eval --model hf --model_args pretrained=STUDENT,trust_remote_code=True --device cpu \\
      --tasks arc_easy

"""


def asks_help(args: Sequence[str]) -> bool:
    """Whether an lm-eval command line only asks for help (no arguments, ``-h``/``--help``, or a bare ``run``).

    Args:
        args: the command line (without the program name).

    Returns:
        ``True`` for a help request.
    """
    args = list(args)
    return not args or args == ["run"] or "-h" in args or "--help" in args


def with_shipped_tasks(args: Sequence[str]) -> list[str]:
    """``args`` plus ``--include_path`` of the shipped task YAMLs, unless they name one or only ask for help.

    Args:
        args: an lm-eval command line (without the program name).

    Returns:
        the command line to run.
    """
    args = list(args)
    if asks_help(args) or any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        return args
    return [*args, "--include_path", str(TASK_DIR)]


def main(args: Sequence[str] | None = None) -> None:
    """``lit-dof lm-eval ARGS``: lm-eval's CLI (``cli_evaluate``) with ``lit_dof`` registered; a help request
    prints :func:`help_preamble` first.

    Args:
        args: lm-eval's arguments (default: the process's, after the program name).

    Raises:
        SystemExit: lm-eval's own exits (``--help``, usage errors).
    """
    from lm_eval.__main__ import cli_evaluate

    argv = with_shipped_tasks(sys.argv[1:] if args is None else args)
    if asks_help(argv):
        sys.stdout.write(help_preamble())
        sys.stdout.flush()
    saved = sys.argv
    sys.argv = [PROG, *argv]  # lm-eval reads (and edits) sys.argv itself
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
