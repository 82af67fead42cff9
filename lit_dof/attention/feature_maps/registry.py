"""The feature-map classes a saved student may name, so loading one never imports a module its ``config.json`` names.

A student's ``config.json`` records its feature map as ``{"class": "module.QualName", "kwargs": {...}}``
(:func:`~lit_dof.students.surgery.feature_map_spec`). Loading looks that name up here and nowhere else — the
spirit of transformers' ``trust_remote_code``: a downloaded config cannot make lit-dof import code. lit-dof's
own maps are registered when :mod:`lit_dof.attention` is imported; a third-party map is registered by the code
that defines it, before a student using it is loaded::

    from lit_dof.attention import register_feature_map

    @register_feature_map
    class MyMap(FeatureMap): ...
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import TypeVar

from lit_dof.attention.feature_maps.base import FeatureMap

F = TypeVar("F", bound=type[FeatureMap])

_REGISTRY: dict[str, type[FeatureMap]] = {}
"""Recorded name (``"module.QualName"`` or an alias) → class."""


def feature_map_name(cls: type[FeatureMap]) -> str:
    """The name a saved config records for ``cls``: ``"module.QualName"``.

    Args:
        cls: a feature-map class.

    Returns:
        ``f"{cls.__module__}.{cls.__qualname__}"``.
    """
    return f"{cls.__module__}.{cls.__qualname__}"


def register_feature_map(cls: F, *, aliases: Iterable[str] = ()) -> F:
    """Let saved students name ``cls``: register it under :func:`feature_map_name` and any ``aliases``.

    Registering the same class again is a no-op, so the call may sit at import time of the defining module;
    usable as a class decorator.

    Args:
        cls: a :class:`~lit_dof.attention.FeatureMap` subclass whose constructor starts
            ``(head_dim, num_heads, feature_dim, ...)``.
        aliases: further names a config may use for it (e.g. a public re-export path).

    Returns:
        ``cls`` itself.

    Raises:
        TypeError: ``cls`` is not a FeatureMap subclass.
        ValueError: a name is already registered to a different class (names must stay unambiguous).
    """
    if not (isinstance(cls, type) and issubclass(cls, FeatureMap)):
        raise TypeError(f"register_feature_map takes a lit_dof.attention.FeatureMap subclass, got {cls!r}")
    names = [feature_map_name(cls), *aliases]
    for name in names:
        known = _REGISTRY.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"feature map name {name!r} is already registered to {known!r}; choose another alias")
    for name in names:
        _REGISTRY[name] = cls
    return cls


def registered_feature_map(name: str) -> type[FeatureMap]:
    """The class registered under ``name``; nothing is imported.

    Args:
        name: a recorded ``"module.QualName"`` (or an alias given to :func:`register_feature_map`).

    Returns:
        The registered class.

    Raises:
        ValueError: ``name`` is not registered (the message says how to register it).
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        module = name.rpartition(".")[0] or "<module>"
        raise ValueError(
            f"feature map class {name!r} is not registered, and lit-dof does not import modules named by a saved "
            f"config. If you trust that code, import it and register the class before loading: `import {module}`, "
            f"then `lit_dof.attention.register_feature_map(<the class>)`. Registered: {', '.join(sorted(_REGISTRY))}"
        )
    return cls


def registered_feature_maps() -> dict[str, type[FeatureMap]]:
    """A copy of the registry: ``{name: class}`` (aliases included)."""
    return dict(_REGISTRY)


def warn_if_unregistered(name: str | None, stacklevel: int = 2) -> None:
    """Warn when a feature-map name (``config.json``'s ``feature_map["class"]``) is not registered: a student
    saved with it will need :func:`register_feature_map` before it loads. ``None`` (no twins) is fine.

    Args:
        name: the recorded name, or ``None``.
        stacklevel: passed to :func:`warnings.warn`.
    """
    if name is not None and name not in _REGISTRY:
        warnings.warn(
            f"feature map {name!r} is not registered: loading this student will need "
            "lit_dof.attention.register_feature_map(<the class>) first",
            stacklevel=stacklevel + 1,
        )
