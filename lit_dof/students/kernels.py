"""Which kernels a student's sliding-window layers run: a runtime choice, not part of the model (its weights and
``config.json`` are the same whatever kernel computes them), set from a fit's config or on a loaded student."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lit_dof.attention.layers.sliding_window import sliding_window_layers

WINDOW_KERNELS = ("torch", "flex")
LINEAR_KERNELS = ("torch", "fla")


@dataclass(frozen=True)
class Kernels:
    """The kernels of every :class:`~lit_dof.attention.SlidingWindowLinearAttention` layer (docs/scale.md,
    "GPU kernels"); the pure linear layers have one kernel.

    Args:
        window: the exact window + sinks of a fresh sequence: ``"torch"`` (banded chunked softmax) or ``"flex"``
            (``torch.nn.attention.flex_attention`` with a block mask; its backward needs CUDA).
        linear: the far term: ``"torch"`` (chunked) or ``"fla"`` (flash-linear-attention's kernels; ``pip install
            'lit-dof[gpu]'``).

    Raises:
        ValueError: an unknown kernel name.
    """

    window: str = "torch"
    linear: str = "torch"

    def __post_init__(self) -> None:
        if self.window not in WINDOW_KERNELS:
            raise ValueError(f"kernels.window must be one of {WINDOW_KERNELS}, got {self.window!r}")
        if self.linear not in LINEAR_KERNELS:
            raise ValueError(f"kernels.linear must be one of {LINEAR_KERNELS}, got {self.linear!r}")

    def apply(self, model: nn.Module) -> int:
        """Set these kernels on every sliding-window layer of ``model`` (per-head groups included).

        Args:
            model: a student (or any module holding sliding-window layers).

        Returns:
            the number of layers set.
        """
        layers = sliding_window_layers(model)
        for layer in layers:
            layer.window_kernel, layer.linear_kernel = self.window, self.linear
        return len(layers)
