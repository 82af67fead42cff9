"""``import lit_dof`` registers the ``"lit_dof"`` model type with transformers' Auto classes, lazily.

A saved student's ``config.json`` says ``model_type: lit_dof``; ``AutoModelForCausalLM.from_pretrained`` finds
:class:`~lit_dof.students.LitDofForCausalLM` once :mod:`lit_dof.students.modeling` has been imported (it calls
``AutoConfig.register`` / ``AutoModelForCausalLM.register``). ``import lit_dof`` must stay light (``lit-dof
--help`` imports neither torch nor transformers), so it does not import that module itself; instead:

- transformers already imported: the student module is imported now;
- otherwise: a one-shot import hook imports it right after transformers' own ``__init__`` has run (the
  post-import-hook pattern of instrumentation libraries), so ``import lit_dof`` followed by
  ``from transformers import AutoModelForCausalLM`` just works.

When transformers is first imported by one of lit-dof's own modules while it is still being imported, the hook
does nothing (importing the student module then could be circular); every path that needs the registration
(``lit_dof.students``, ``load_student``, the CLI) imports the student module itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

STUDENT_MODULE = "lit_dof.students.modeling"
"""The module whose import registers the ``"lit_dof"`` model type."""


def register_with_transformers() -> None:
    """Import :data:`STUDENT_MODULE` now if transformers is loaded, else once it is (see the module docstring)."""
    if STUDENT_MODULE in sys.modules:
        return
    if "transformers" in sys.modules:
        _register()
    elif not any(isinstance(finder, _AfterTransformers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformers())


def _register() -> None:
    """Import the student module; a failure (e.g. torch missing) warns instead of breaking the caller's import."""
    try:
        importlib.import_module(STUDENT_MODULE)
    except Exception as exc:  # noqa: BLE001 - an import hook must not break `import transformers`
        warnings.warn(
            f"lit-dof could not register its model type with transformers: {exc!r}; "
            f"import {STUDENT_MODULE} to see the error",
            stacklevel=2,
        )


def _lit_dof_importing() -> bool:
    """Whether a lit-dof module is being imported right now (it imported transformers)."""
    modules = [m for name, m in list(sys.modules.items()) if name == "lit_dof" or name.startswith("lit_dof.")]
    return any(getattr(getattr(m, "__spec__", None), "_initializing", False) for m in modules)


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """A one-shot finder: lets the normal finders locate ``transformers`` and makes its loader import the
    student module after transformers' ``__init__`` has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; the lookup below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module) -> None:
            exec_module(module)
            if STUDENT_MODULE not in sys.modules and not _lit_dof_importing():
                _register()

        loader.exec_module = exec_then_register
        return spec
