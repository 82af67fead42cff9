"""Layer-wise distillation losses as injectable objects (:class:`LayerLoss`).

:class:`~lit_dof.pipeline.layerwise.LayerwiseDistillation` takes one :class:`LayerLoss` instance and calls it on
every linear twin with that layer's captured teacher attention; configs choose it by ``class_path``::

    model:
      init_args:
        loss: lit_dof.students.layer_losses.KernelL2Loss   # or {class_path: ...}

The three shipped losses wrap the math of :mod:`lit_dof.students.losses` unchanged. A new loss is one subclass
(``needs_values`` says whether the teacher capture must keep v and the attention output) and its class path in a
config; nothing else changes — ``lit-dof plan`` sizes its memory by :meth:`LayerLoss.step_bytes`, which a subclass
may override (:class:`LayerStep` gives the shapes, :class:`LossBytes` takes the answer). Notation: B batch, Hq
query heads, Hk KV heads, T tokens, R scored query rows, d / D head sizes, M the twin's feature dim.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from lit_dof.students.losses import attention_distillation_loss, attention_output_loss
from lit_dof.students.query_rows import StratifiedRows

if TYPE_CHECKING:
    from lit_dof.attention import CausalLinearAttention
    from lit_dof.teacher.capture import CapturedAttention


@dataclass(frozen=True)
class LayerStep:
    """The shapes of one linear twin's layer-wise step, as :meth:`LayerLoss.step_bytes` sees them.

    Attributes:
        batch: B, sequences per rank. query_heads: Hq. kv_heads: Hk. tokens: T per sequence.
        query_rows: R ≤ T, the query rows scored per sequence. head_dim: d. feature_dim: M of this layer's twin.
        captured_bytes: bytes of this layer's captured teacher q ``(B, Hq, T, d)`` and k ``(B, Hk, T, d)`` in the
            teacher's dtype.
        twin_bytes: bytes the twin's chunked linear attention on all T tokens keeps for backward
            (:meth:`~lit_dof.attention.CausalLinearAttention.activation_bytes`).
        window_bytes: bytes the twin's sliding-window part keeps for backward
            (:meth:`~lit_dof.attention.SlidingWindow.activation_bytes`; 0 for pure linear attention).
    """

    batch: int
    query_heads: int
    kv_heads: int
    tokens: int
    query_rows: int
    head_dim: int
    feature_dim: int
    captured_bytes: int
    twin_bytes: int
    window_bytes: int

    @property
    def scores(self) -> int:
        """B·Hq·R·T: the elements of one ``(B, Hq, R, T)`` matrix of query-key scores."""
        return self.batch * self.query_heads * self.query_rows * self.tokens


@dataclass(frozen=True)
class LossBytes:
    """The memory of one layer's loss in a layer-wise step, in bytes per rank.

    Attributes:
        saved: what its graph keeps for backward, from the loss's forward until its backward (with
            ``layer_backward`` one layer's at a time, else every layer's at once).
        transient: what is alive only while the loss is computed, on top of ``saved``.
    """

    saved: int
    transient: int


class LayerLoss(ABC):
    """One layer's distillation loss of a linear twin against the teacher's captured attention.

    Attributes:
        name: short name shown in reports and memory plans (a subclass without one gets its class name).
        needs_values: the loss reads ``captured.v`` and ``captured.out``; the teacher capture keeps them only then.
        saved_bytes_per_score, transient_bytes_per_score: bytes per element of a ``(B, Hq, R, T)`` score matrix that
            the default :meth:`step_bytes` counts as kept for backward and as alive only inside the loss.
    """

    name: ClassVar[str] = "layer"
    needs_values: ClassVar[bool] = False
    saved_bytes_per_score: ClassVar[int] = 24
    transient_bytes_per_score: ClassVar[int] = 28

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    @abstractmethod
    def __call__(
        self,
        twin: CausalLinearAttention,
        captured: CapturedAttention,
        *,
        query_rows: int | StratifiedRows | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """The loss of ``twin`` on one layer's capture (only the twin's parameters may receive gradients).

        Args:
            twin: the layer's :class:`~lit_dof.attention.CausalLinearAttention`.
            captured: the teacher's ``q (B, Hq, T, d)``, ``k (B, Hk, T, d)``, ``key_padding (B, T)`` (or ``None``)
                and, when ``needs_values``, ``v (B, Hk, T, D)`` and ``out (B, T, Hq, D)`` (``v`` also for a twin
                whose far memory has a forget gate, ``twin.far_gated``).
            query_rows: score this many random query rows per sequence (``None``: all T), or a
                :class:`~lit_dof.students.query_rows.StratifiedRows`; a loss may ignore it.
            generator: RNG for the row subset.

        Returns:
            a 0-d float32 tensor.
        """

    def step_bytes(self, step: LayerStep) -> LossBytes:
        """The memory of this loss on one layer in a layer-wise step (``lit-dof plan`` sums it over layers).

        The default counts a loss over dense ``(B, Hq, R, T)`` score matrices as the shipped row losses are:
        ``saved_bytes_per_score`` (``transient_bytes_per_score``) bytes per score kept for backward (alive only
        inside the loss), plus the twin's log-features of the R rows and T keys in float64 kept for backward
        (8 bytes per row or key, head and feature) and three float32 copies of them alive inside the loss. A
        subclass whose memory differs overrides this method or the two class attributes.

        Args:
            step: the layer's shapes.

        Returns:
            bytes per rank (:class:`LossBytes`).
        """
        rows_and_keys = step.batch * step.query_heads * (step.query_rows + step.tokens) * step.feature_dim
        return LossBytes(
            saved=step.scores * self.saved_bytes_per_score + rows_and_keys * 8,
            transient=step.scores * self.transient_bytes_per_score + rows_and_keys * 4 * 3,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:  # stateless: equal to any instance of the same class
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


class SoftmaxRowLoss(LayerLoss):
    """The paper's softmax loss: KL between the teacher's causal attention rows and the twin's normalised rows
    (:func:`~lit_dof.students.losses.attention_distillation_loss` with ``kind="softmax"``)."""

    name = "softmax"

    def __call__(self, twin, captured, *, query_rows=None, generator=None) -> Tensor:
        """KL between the teacher's and the twin's attention rows (see :meth:`LayerLoss.__call__`)."""
        q, k, pad = captured.q, captured.k, captured.key_padding
        return attention_distillation_loss(
            twin,
            q,
            k,
            pad,
            kind="softmax",
            query_rows=query_rows,
            generator=generator,
            rotary=captured.rotary,
            values=captured.v,
        )


class KernelL2Loss(LayerLoss):
    """The paper's L2 loss: squared error between exp(qᵀk/√d) and K̂(q, k) over valid pairs, in float64
    (:func:`~lit_dof.students.losses.attention_distillation_loss` with ``kind="l2"``; not for sliding-window twins)."""

    name = "l2"
    saved_bytes_per_score = 32
    transient_bytes_per_score = 40

    def __call__(self, twin, captured, *, query_rows=None, generator=None) -> Tensor:
        """Squared error of the kernel over valid (query, key) pairs (see :meth:`LayerLoss.__call__`)."""
        q, k, pad = captured.q, captured.k, captured.key_padding
        return attention_distillation_loss(twin, q, k, pad, kind="l2", query_rows=query_rows, generator=generator)


class OutputLoss(LayerLoss):
    """Block-output matching (Distill-then-Replace): relative squared error of the twin's attention output on the
    teacher's q/k/v against the teacher's (:func:`~lit_dof.students.losses.attention_output_loss`; all rows, so
    ``query_rows`` and ``generator`` are unused)."""

    name = "output"
    needs_values = True

    def step_bytes(self, step: LayerStep) -> LossBytes:
        """The twin's chunked forward on all T tokens, kept for backward (its sliding-window band saves nothing:
        the captured q/k need no gradient), with half the layer's captured q/k for the captured values and output
        it compares; inside the loss the band's activations as well (see :meth:`LayerLoss.step_bytes`)."""
        return LossBytes(
            saved=step.twin_bytes + step.captured_bytes // 2, transient=step.twin_bytes + step.window_bytes
        )

    def __call__(self, twin, captured, *, query_rows=None, generator=None) -> Tensor:
        """Relative squared error of the twin's attention output (see :meth:`LayerLoss.__call__`).

        Raises:
            ValueError: the capture lacks ``v`` or ``out``.
        """
        if captured.v is None or captured.out is None:
            raise ValueError("OutputLoss needs the captured values and attention output (capture with needs_values)")
        c = captured
        return attention_output_loss(twin, c.q, c.k, c.v, c.out, c.key_padding, c.rotary)


# Saved run configs and checkpoint hparams from before the losses were objects say ``loss: softmax|l2|output``.
# This table is the one place those strings are understood; new configs name a class path instead.
LEGACY_LOSS_NAMES: dict[str, type[LayerLoss]] = {"softmax": SoftmaxRowLoss, "l2": KernelL2Loss, "output": OutputLoss}


def resolve_layer_loss(loss: LayerLoss | str) -> LayerLoss:
    """``loss`` as a :class:`LayerLoss`: an instance as is, a legacy name (:data:`LEGACY_LOSS_NAMES`) as its class.

    Raises:
        ValueError: any other value (the message names the valid strings and the class-path form).
    """
    if isinstance(loss, LayerLoss):
        return loss
    if isinstance(loss, str) and loss in LEGACY_LOSS_NAMES:
        return LEGACY_LOSS_NAMES[loss]()
    raise ValueError(
        f"loss must be a LayerLoss (e.g. class_path: {__name__}.SoftmaxRowLoss) or one of the legacy names "
        f"{', '.join(repr(n) for n in LEGACY_LOSS_NAMES)}; got {loss!r}"
    )


def layer_loss_name(value: Any) -> str:
    """The short name of a loss as a saved config holds it — a legacy string, a class path, ``{class_path: …}``
    (a mapping or a parsed namespace), a class or an instance — e.g. ``"softmax"``; an unknown class path gives
    its last component."""
    if isinstance(value, LayerLoss) or (isinstance(value, type) and issubclass(value, LayerLoss)):
        return value.name
    if isinstance(value, Mapping):
        value = value.get("class_path", "")
    value = getattr(value, "class_path", value)  # a parsed jsonargparse Namespace
    value = str(value)
    if value in LEGACY_LOSS_NAMES:
        return value
    for cls in LEGACY_LOSS_NAMES.values():
        if value in (cls.__name__, f"{cls.__module__}.{cls.__name__}"):
            return cls.name
    return value.rsplit(".", 1)[-1]
