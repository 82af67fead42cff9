"""Argument checks shared by the attention kernels and feature maps.

Every check raises :class:`ValueError` whose message names the argument and the accepted range,
so a bad call fails at the boundary rather than as a NaN three layers later.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_positive_int(name: str, value: int) -> int:
    """Return ``value`` if it is an integer ≥ 1.

    Raises:
        ValueError: if ``value`` is not an int or is ≤ 0.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")
    return value


def check_rank(name: str, tensor: Tensor, rank: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``tensor`` has ``rank`` dimensions (``layout`` names them)."""
    if tensor.dim() != rank:
        raise ValueError(f"{name} must have shape {layout}, got a {tensor.dim()}-d tensor {tuple(tensor.shape)}")


def check_attention_call(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, num_heads: int, num_kv_heads: int
) -> int:
    """Validate an attention layer's call — q ``(B, Hq, T, d)``, k ``(B, Hk, Tk, d)``, v ``(B, Hk, Tk, D)``, a
    ``(B, Tk)`` padding mask — against the layer's Hq and Hk; returns Tk.

    Raises:
        ValueError: q/k/v of the wrong rank or head counts, Tk < T, or a padding mask that is not ``(B, Tk)``.
    """
    check_rank("q", q, 4, "(B, Hq, T, d)")
    check_rank("k", k, 4, "(B, Hk, Tk, d)")
    B, Hq, T, _ = q.shape
    Tk = k.shape[2]
    if Hq != num_heads or k.shape[1] != num_kv_heads or v.shape[1] != num_kv_heads or Tk < T:
        raise ValueError(
            f"expected q with {num_heads} heads and k, v with {num_kv_heads} and at least as many tokens as q, got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, Tk):
        raise ValueError(f"key_padding_mask must have shape (B, Tk) = {(B, Tk)}, got {tuple(key_padding_mask.shape)}")
    return Tk


def check_finite(name: str, tensor: Tensor) -> None:
    """Raise ``ValueError`` if ``tensor`` holds NaN (or +inf).

    ``-inf`` is allowed: it is the log of a zero feature. One reduction decides: the maximum propagates NaN and
    is +inf exactly when an entry is, so ``amax < inf`` holds iff no entry is NaN or +inf. On CUDA the check
    is asynchronous (``torch._assert_async``) so it does not force a host sync; it then raises ``RuntimeError``.
    """
    if tensor.numel() == 0:
        return
    ok = tensor.detach().amax() < float("inf")
    if tensor.is_cuda:
        torch._assert_async(ok, f"{name} contains NaN or +inf")
    elif not ok:
        raise ValueError(f"{name} contains NaN or +inf; check the inputs (and the loss scale) upstream")


def check_qkv(
    log_phi_q: Tensor, log_phi_k: Tensor, v: Tensor, *, finite: bool = True
) -> tuple[int, int, int, int, int, int]:
    """Validate the inputs of a linear-attention kernel.

    Args:
        log_phi_q: ``(B, Hq, T, M)`` log-features of the queries.
        log_phi_k: ``(B, Hk, T, M)`` log-features of the keys; ``Hq`` must be a multiple of ``Hk`` (GQA).
        v: ``(B, Hk, T, D)`` values.
        finite: also reject NaN / +inf entries.

    Returns:
        ``(B, Hq, Hk, T, M, D)``.

    Raises:
        ValueError: wrong rank, mismatched batch / length / feature dim / head counts, or NaN input.
    """
    check_rank("log_phi_q", log_phi_q, 4, "(B, Hq, T, M)")
    check_rank("log_phi_k", log_phi_k, 4, "(B, Hk, T, M)")
    check_rank("v", v, 4, "(B, Hk, T, D)")
    B, Hq, T, M = log_phi_q.shape
    Bk, Hk, Tk, Mk = log_phi_k.shape
    if (Bk, Tk, Mk) != (B, T, M):
        raise ValueError(
            f"log_phi_k must have shape (B, Hk, T, M) = ({B}, Hk, {T}, {M}) to match log_phi_q, "
            f"got {tuple(log_phi_k.shape)}"
        )
    if v.shape[:3] != (B, Hk, T):
        raise ValueError(f"v must have shape (B, Hk, T, D) = ({B}, {Hk}, {T}, D), got {tuple(v.shape)}")
    if Hk == 0 or Hq % Hk != 0:
        raise ValueError(f"the number of query heads ({Hq}) must be a positive multiple of the key/value heads ({Hk})")
    if finite:
        check_finite("log_phi_q", log_phi_q)
        check_finite("log_phi_k", log_phi_k)
        check_finite("v", v)
    return B, Hq, Hk, T, M, v.shape[-1]


def check_sink_tokens(sink_tokens) -> None:
    """Raise ``ValueError`` unless ``sink_tokens`` is an integer ≥ 0 (attention sinks)."""
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
        raise ValueError(f"sink_tokens must be an integer >= 0, got {sink_tokens!r}")


def check_grouped_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int]:
    """Validate queries ``(B, Hq, T, d)``, keys ``(B, Hk, T, d)`` and values ``(B, Hk, T, D)`` of grouped-query
    attention (``Hq`` a multiple of ``Hk``) and return ``(B, Hq, Hk, T, d)``.

    Raises:
        ValueError: a wrong rank or inconsistent shapes.
    """
    check_rank("q", q, 4, "(B, Hq, T, d)")
    check_rank("k", k, 4, "(B, Hk, T, d)")
    check_rank("v", v, 4, "(B, Hk, T, D)")
    B, Hq, T, d = q.shape
    Hk = k.shape[1]
    if k.shape != (B, Hk, T, d) or v.shape[:3] != (B, Hk, T) or Hk == 0 or Hq % Hk:
        raise ValueError(
            f"expected q (B, Hq, T, d), k (B, Hk, T, d), v (B, Hk, T, D) with Hq a multiple of Hk, "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    return B, Hq, Hk, T, d
