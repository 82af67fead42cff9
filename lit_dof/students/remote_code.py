"""Students that load the standard way: ``auto_map`` and two small code files in every saved student folder.

transformers loads a model whose ``model_type`` it does not know from the classes that ``config.json``'s
``auto_map`` names, in ``.py`` files beside it, once the caller passes ``trust_remote_code=True``
(``transformers.dynamic_module_utils``: the files are copied into its module cache and imported). A saved student
carries

* ``configuration_lit_dof.py`` — imports :class:`~lit_dof.students.LitDofConfig` from the *installed* lit-dof, after
  checking that lit-dof is installed and at least the version that wrote the folder;
* ``modeling_lit_dof.py`` — imports :class:`~lit_dof.students.LitDofForCausalLM` the same way;
* ``auto_map`` in ``config.json``: ``AutoConfig`` and ``AutoModelForCausalLM`` → those two names.

No model code is copied: the files only import lit-dof, so a folder never runs code older than the installed
package, and one without lit-dof (or with an older one) fails with an ``ImportError`` naming
``pip install "lit-dof>=VERSION"``. The imports of lit-dof sit in ``try`` blocks, which transformers' own
dependency scan (``check_imports``) skips, so that message is lit-dof's, not a bare "pip install lit_dof".

So, in a process that never imports lit-dof itself::

    AutoModelForCausalLM.from_pretrained(student, trust_remote_code=True)
    transformers.pipeline("text-generation", model=student, trust_remote_code=True)
    lm_eval --model hf --model_args pretrained=STUDENT,trust_remote_code=True --device cpu --tasks ...

``import lit_dof`` first still loads a student without ``trust_remote_code`` (the ``lit_dof`` model type is
registered, and transformers prefers a registered class to a folder's code), and folders saved before these files
existed load that way as before; :func:`write_remote_code` adds the files to such a folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lit_dof.io import atomic_write_text

CONFIG_CODE_FILE = "configuration_lit_dof.py"
"""The student folder's configuration module (imports ``LitDofConfig`` from the installed lit-dof)."""

MODEL_CODE_FILE = "modeling_lit_dof.py"
"""The student folder's model module (imports ``LitDofForCausalLM`` from the installed lit-dof)."""

AUTO_MAP = {
    "AutoConfig": "configuration_lit_dof.LitDofConfig",
    "AutoModelForCausalLM": "modeling_lit_dof.LitDofForCausalLM",
}
"""``config.json``'s ``auto_map``: transformers' Auto class → ``module.Class`` in the student folder."""

_CHECK = '''\
LIT_DOF_REQUIRED = "{version}"
"""The lit-dof version that wrote this folder: the oldest one that can load it."""

_INSTALL = f'pip install "lit-dof>={{LIT_DOF_REQUIRED}}"'

try:  # in a try block: transformers' dependency scan skips it, so a missing lit-dof gets the message below
    import lit_dof
    from packaging.version import Version
except ImportError as exc:
    raise ImportError(
        f"this model is a lit-dof student: loading it needs the lit-dof package, which is not installed: {{_INSTALL}}"
    ) from exc

_INSTALLED = str(getattr(lit_dof, "__version__", "0"))
if Version(_INSTALLED) < Version(LIT_DOF_REQUIRED):
    raise ImportError(
        f"this model was written by lit-dof {{LIT_DOF_REQUIRED}}; the installed lit-dof is {{_INSTALLED}}: {{_INSTALL}}"
    )
'''

_CONFIG_TEMPLATE = '''\
"""The configuration of a lit-dof student, for ``AutoConfig.from_pretrained(..., trust_remote_code=True)``.

Written by lit-dof {version}. It holds no model code: it imports the installed lit-dof package
(``pip install "lit-dof>={version}"``) and checks its version.
"""

{check}
try:
    from lit_dof.students.config import LitDofConfig
except ImportError as exc:
    raise ImportError(f"lit-dof {{_INSTALLED}} cannot load this model: {{_INSTALL}}") from exc

__all__ = ["LIT_DOF_REQUIRED", "LitDofConfig"]
'''

_MODEL_TEMPLATE = '''\
"""The model of a lit-dof student, for ``AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)``.

Written by lit-dof {version}. It holds no model code: it imports the installed lit-dof package
(``pip install "lit-dof>={version}"``); ``configuration_lit_dof`` checks its version.
"""

from .configuration_lit_dof import LIT_DOF_REQUIRED, LitDofConfig

try:
    from lit_dof.students.modeling import LitDofForCausalLM
except ImportError as exc:
    raise ImportError(f'lit-dof cannot load this model: pip install "lit-dof>={{LIT_DOF_REQUIRED}}"') from exc

__all__ = ["LitDofConfig", "LitDofForCausalLM"]
'''


def writer_version() -> str:
    """The version of the lit-dof writing a student: ``lit_dof.__version__``, which the folder's code compares
    with the installed package's on load.

    Returns:
        a PEP 440 version string, e.g. ``0.1.0``.
    """
    from lit_dof import __version__

    return __version__


def remote_code_files(version: str | None = None) -> dict[str, str]:
    """The two code files of a student folder.

    Args:
        version: the lit-dof version they require (default: :func:`writer_version`).

    Returns:
        ``{file name: source}`` for :data:`CONFIG_CODE_FILE` and :data:`MODEL_CODE_FILE`.
    """
    version = version or writer_version()
    check = _CHECK.format(version=version)
    return {
        CONFIG_CODE_FILE: _CONFIG_TEMPLATE.format(version=version, check=check),
        MODEL_CODE_FILE: _MODEL_TEMPLATE.format(version=version),
    }


def write_remote_code(directory: str | os.PathLike, version: str | None = None) -> list[Path]:
    """Make a student folder load with ``trust_remote_code=True``: write the two code files and put
    :data:`AUTO_MAP` into its ``config.json`` (each file atomically). Also upgrades a folder saved before
    lit-dof wrote these files.

    Args:
        directory: a student folder (``config.json`` with ``model_type: lit_dof``).
        version: the lit-dof version the files require (default: :func:`writer_version`).

    Returns:
        the paths written: the two code files and ``config.json``.

    Raises:
        FileNotFoundError: no ``config.json`` in ``directory``.
        ValueError: ``config.json`` is not a lit-dof student's (its ``model_type`` is not ``lit_dof``).
    """
    directory = Path(directory)
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if not isinstance(config, dict) or config.get("model_type") != "lit_dof":
        raise ValueError(f"{config_file} is not a lit-dof student's config (model_type must be 'lit_dof')")
    written = []
    for name, source in remote_code_files(version).items():
        atomic_write_text(directory / name, source)
        written.append(directory / name)
    config["auto_map"] = dict(AUTO_MAP)
    atomic_write_text(config_file, json.dumps(config, indent=2, sort_keys=True) + "\n")  # transformers' layout
    return [*written, config_file]
