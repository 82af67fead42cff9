"""Precision policy: what runs in float32 whatever the trainer's precision, and which dtype the teacher gets.

Under ``bf16-mixed`` / ``16-mixed`` (autocast) and ``bf16-true`` / ``16-true`` (half default dtype, half
weights) the teacher runs in half precision, but three things stay float32:

* the linear-attention kernels (chunked, recurrent) and the feature maps' log-features: they exponentiate
  and accumulate prefix sums, where bf16's 8-bit mantissa loses whole rows;
* the distillation losses (softmax rows, kernel L2, output and logit KL);
* the feature maps' trainable parameters (z, log α, …), the master weights the optimizer updates.

:func:`fp32_region` is the one way the code enters such a region: autocast off and a half default dtype
pinned back to float32, after the caller's explicit upcast (:func:`upcast`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Literal

import torch
from torch import Tensor, nn

HALF_DTYPES = (torch.float16, torch.bfloat16)

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
"""A dtype option's value: ``"auto"`` follows the trainer's precision (:func:`precision_dtype`)."""

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtype names a dtype option accepts besides ``"auto"``."""

_TRUE_HALF = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


def _autocast_device_types() -> list[str]:
    """Device types whose autocast may be on: the CPU, CUDA and the current accelerator (if any)."""
    types = ["cpu", "cuda"]
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is not None and accelerator.type not in types:
        types.append(accelerator.type)
    return types


@contextlib.contextmanager
def fp32_region() -> Iterator[None]:
    """Run the block (or, used as ``@fp32_region()``, the decorated function) in at least float32.

    Inside, autocast is disabled on every device type where it is on, and a half default dtype (Lightning's
    ``bf16-true`` / ``16-true`` set it around ``configure_model`` and every step) is pinned to float32, so
    freshly created tensors are float32 too; both are restored on exit, also on an exception. Tensors that
    arrive in half precision must still be upcast explicitly (:func:`upcast`): autocast off does not
    convert them. A float64 default dtype is left alone.
    """
    with contextlib.ExitStack() as stack:
        for device_type in _autocast_device_types():
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
        previous = torch.get_default_dtype()
        if previous in HALF_DTYPES:
            torch.set_default_dtype(torch.float32)
            stack.callback(torch.set_default_dtype, previous)
        yield


def upcast(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 if it is float16/bfloat16, else unchanged (float32, float64, integer, bool)."""
    return tensor.float() if tensor.dtype in HALF_DTYPES else tensor


def precision_dtype(precision: str | int | None) -> torch.dtype:
    """The parameter dtype a Lightning ``precision`` implies for a frozen model.

    Args:
        precision: Lightning's precision flag (``trainer.precision``): ``"bf16-true"`` → bfloat16,
            ``"16-true"`` → float16, anything else (``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``None``…)
            → float32 (mixed precision keeps float32 weights and autocasts the matmuls).

    Returns:
        the ``torch.dtype``.
    """
    return _TRUE_HALF.get(str(precision), torch.float32)


def resolve_dtype(name: DtypeName, precision: str | int | None) -> torch.dtype:
    """A dtype option: ``"auto"`` → :func:`precision_dtype` of ``precision``, else the named dtype.

    Args:
        name: ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        precision: Lightning's precision flag (used for ``"auto"``).

    Raises:
        ValueError: any other name.
    """
    if name == "auto":
        return precision_dtype(precision)
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


class Float32Parameters(nn.Module):
    """Base of modules whose float32 parameters are master weights: ``.to(torch.bfloat16)``, ``.half()`` and
    Lightning's ``bf16-true`` conversion leave them (and their buffers and gradients) float32, submodules
    included; device moves and ``.double()`` still apply. The feature maps and the linear-attention layers
    are such modules.
    """

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module._apply`` (behind ``.to``, ``.half``, ``.cuda``…), except that a float32 parameter, buffer
        or gradient that ``fn`` would turn into float16/bfloat16 stays float32 (on ``fn``'s device).

        Args:
            fn: the per-tensor conversion.
            recurse: apply it to submodules too.

        Returns:
            this module.
        """

        def keep_float32(tensor: Tensor) -> Tensor:
            converted = fn(tensor)
            if tensor.dtype == torch.float32 and converted.dtype in HALF_DTYPES:
                return tensor.to(device=converted.device)  # from the original: no round trip through half
            return converted

        return super()._apply(keep_float32, recurse)
