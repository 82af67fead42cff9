"""The shipped configuration files (``configs/`` of the repository, the package ``lit_dof.configs`` once installed).

The YAML recipes (``quickstart.yaml``; ``base.yaml`` with ``methods/*.yaml`` composed over it; ``models/*.yaml``,
``trainer/*.yaml`` …) and the architecture files of ``lit-dof plan`` (``models/<name>/config.json``) live in
``configs/`` at the repository root, where commands and documents name them (``lit-dof fit --config
configs/quickstart.yaml``). A wheel
ships the same directory as the package ``lit_dof.configs`` (setup.py maps that package to ``configs/``),
so an installed lit-dof finds them through :mod:`importlib.resources`.

A **name** is a path relative to that directory, with or without ``.yaml``: ``quickstart``,
``methods/dof``, ``trainer/gpu.yaml``, ``models/gpt2/config.json``.

    from lit_dof.config_files import config_path, shipped_configs
    config_path("quickstart")            # …/configs/quickstart.yaml
    shipped_configs()                    # ['capture', 'finetune/arc_easy', …, 'trainer/gpu']

``lit-dof configs list|show|copy`` is the command-line face of these functions.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

CONFIG_PACKAGE = "lit_dof.configs"
"""The package the wheel installs ``configs/`` as."""


def config_root() -> Path:
    """The directory holding the shipped configs.

    In a source checkout (the package imported from the repository, installed editable or not at all) this
    is the checkout's own ``configs/``; otherwise the installed package ``lit_dof.configs``, resolved with
    :func:`importlib.resources.files`. The checkout comes first so that two checkouts sharing one
    environment each read their own files.

    Returns:
        the absolute directory.

    Raises:
        FileNotFoundError: neither exists (a broken install).
    """
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs" / "quickstart.yaml").is_file():
        return checkout / "configs"
    try:
        root = importlib.resources.files(CONFIG_PACKAGE)
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            f"no shipped configs: neither {checkout / 'configs'} nor the package "
            f"{CONFIG_PACKAGE} exists (reinstall lit-dof)"
        ) from exc
    if not isinstance(root, Path):  # a zip import: the YAML files must be real files for `--config`
        raise FileNotFoundError(f"{CONFIG_PACKAGE} is not a directory ({root!r}); install lit-dof unzipped")
    return root


def shipped_configs() -> list[str]:
    """Names of the shipped YAML configs, sorted (``quickstart``, ``methods/dof``, …; no ``.yaml``).

    Returns:
        the names, relative to :func:`config_root`, with ``/`` separators.
    """
    root = config_root()
    return sorted(path.relative_to(root).with_suffix("").as_posix() for path in root.rglob("*.yaml"))


def config_path(name: str | os.PathLike) -> Path:
    """The file of a shipped config.

    Args:
        name: a path relative to the configs directory, with or without ``.yaml`` (``quickstart``,
            ``methods/dof.yaml``, ``models/gpt2/config.json``); a leading ``configs/`` is accepted, so the
            paths written in commands and documents resolve too.

    Returns:
        the absolute path of an existing file.

    Raises:
        FileNotFoundError: no such shipped file (the message lists the shipped names); a name outside the
            configs directory counts as missing.
    """
    root = config_root()
    text = Path(name).as_posix().removeprefix("configs/")
    candidates = [root / text] + ([] if text.endswith((".yaml", ".yml", ".json")) else [root / f"{text}.yaml"])
    for candidate in candidates:
        resolved = candidate.resolve()
        if resolved.is_file() and resolved.is_relative_to(root.resolve()):
            return resolved
    raise FileNotFoundError(f"no shipped config {str(name)!r}; shipped: {', '.join(shipped_configs())}")


def config_description(name: str | os.PathLike) -> str:
    """The first comment line of a shipped config (its one-line summary), without the ``#``.

    Args:
        name: as for :func:`config_path`.

    Returns:
        the text of the first line starting with ``#``, or ``""`` when the file has no comment.
    """
    for line in config_path(name).read_text().splitlines():
        if line.lstrip().startswith("#"):
            return line.lstrip().lstrip("#").strip()
    return ""


def copy_config(name: str | os.PathLike, dest: str | os.PathLike | None = None) -> Path:
    """Copy a shipped config to ``dest`` for editing; never overwrites.

    Args:
        name: as for :func:`config_path`.
        dest: the new file, or an existing directory to copy into (default: the current directory); the file
            keeps the config's base name unless ``dest`` names another.

    Returns:
        the path written.

    Raises:
        FileExistsError: the destination file exists already.
        FileNotFoundError: no such shipped config, or ``dest``'s parent directory does not exist.
    """
    source = config_path(name)
    target = Path(dest) if dest is not None else Path.cwd()
    if target.is_dir():
        target = target / source.name
    if target.exists():
        raise FileExistsError(f"{target} exists; not overwriting it (remove it or give another destination)")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"no directory {target.parent} to copy {source.name} into")
    with open(target, "x") as out:  # "x": a file created since the check above is not overwritten either
        out.write(source.read_text())
    return target
