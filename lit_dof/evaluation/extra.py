"""lm-eval is an optional dependency (the ``eval`` extra): every use imports it through :func:`require_lm_eval`."""

from __future__ import annotations

from types import ModuleType

from lit_dof.extras import MissingExtraError, install_hint

INSTALL_HINT = install_hint("eval")
"""How to install the optional zero-shot evaluation dependency (lm-eval)."""

__all__ = ["INSTALL_HINT", "MissingExtraError", "require_lm_eval"]


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
