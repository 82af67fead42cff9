"""lm-eval is an optional dependency (the ``eval`` extra): every use imports it through :func:`require_lm_eval`."""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = "pip install 'lit-dof[eval]'"
"""How to install the optional zero-shot evaluation dependency (lm-eval)."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra provides it."""


def require_lm_eval(feature: str) -> ModuleType:
    """Import lm-eval for ``feature``, or say how to install it.

    Args:
        feature: what needs it, for the message (e.g. ``"lit-dof eval"``).

    Returns:
        the ``lm_eval`` module.

    Raises:
        MissingExtraError: (an ``ImportError``) lm-eval is not installed; the message names ``feature`` and
            :data:`INSTALL_HINT`.
    """
    try:
        import lm_eval
    except ImportError as exc:
        raise MissingExtraError(f"{feature} needs lm-eval, an optional dependency of lit-dof: {INSTALL_HINT}") from exc
    return lm_eval
