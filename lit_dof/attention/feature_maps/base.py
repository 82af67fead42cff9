"""The feature-map interface shared by the learned map and the baselines.

A feature map turns per-head vectors ``(B, H, T, D)`` into positive features ``(B, H, T, M)`` whose
inner products approximate the softmax kernel K(x, y) = exp(xᵀy/√d) (METHOD.md §1). Every map here is
exponential, so it exposes its *log*-features: the attention kernels stabilise in log space and never
materialise φ itself, which is what keeps large query/key norms finite.

Any subclass whose constructor starts ``(head_dim, num_heads, feature_dim, ...)`` is itself a
feature-map factory: ``factory(head_dim, num_heads, feature_dim) -> FeatureMap``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from lit_dof.attention._validation import check_finite, check_positive_int, check_rank
from lit_dof.precision import Float32Parameters, fp32_region

PARAM_GROUPS = ("z", "log_alpha", "other")
"""The optimizer groups a :meth:`FeatureMap.param_groups` may name (the layer-wise phase's ``lr_z``,
``lr_alpha`` and ``lr``)."""


class FeatureMap(Float32Parameters, ABC):
    """Per-head positive feature map φ: ``(B, H, T, D) → (B, H, T, M)``.

    Precision: parameters and buffers are created in float32 whatever the default dtype, and converting
    the module to float16/bfloat16 (``.to(torch.bfloat16)``, ``.half()``, Lightning's ``bf16-true``
    ``convert_module``) leaves them float32 — they are the optimizer's master weights — while devices
    still change and float64 still applies. Log-features are computed in float32 with autocast off.

    Args:
        head_dim: d, the size of each query/key vector (≥ 1).
        num_heads: H, the number of heads with their own parameters (≥ 1).
        feature_dim: M, the number of features (≥ 1); change it later with :meth:`resize`.
        seed: seed of the map's initial random draws (:meth:`seeded_generator`; ``None``: the global RNG).
        check_inputs: reject NaN / +inf inputs in :meth:`log_features` (one reduction per call).

    Raises:
        ValueError: any of the sizes is not a positive integer.
    """

    def __init__(
        self, head_dim: int, num_heads: int, feature_dim: int, *, seed: int | None = None, check_inputs: bool = True
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.feature_dim = check_positive_int("feature_dim", feature_dim)
        self.seed = seed
        self.check_inputs = check_inputs

    def seeded_generator(self) -> torch.Generator | None:
        """A fresh CPU generator seeded with :attr:`seed` (the same draws on every call), or ``None`` without a
        seed (draws then come from the global RNG)."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed)

    def extra_repr(self) -> str:
        """Head size d, heads H and feature dimension M, for ``print(module)``."""
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, feature_dim={self.feature_dim}"

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """This map's parameters by optimizer group (:data:`PARAM_GROUPS`): ``"z"`` — projections, trained at
        ``lr_z`` — ``"log_alpha"`` — feature weights, at ``lr_alpha`` — or ``"other"`` (``lr``). The default puts
        every parameter in ``"other"``; a map whose parameters want their own learning rates overrides it.

        Returns:
            ``{group: [parameters]}``, every parameter of the map in exactly one group.
        """
        return {"other": list(self.parameters())}

    def config_kwargs(self) -> dict:
        """JSON-serialisable constructor keywords (beyond d, H, M) needed to rebuild this map's behaviour;
        parameters and buffers are restored from the checkpoint, so seeds are not included."""
        return {}

    def _check_input(self, x: Tensor) -> None:
        check_rank("x", x, 4, "(B, H, T, D)")
        if x.shape[1] != self.num_heads or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"x must have shape (B, H={self.num_heads}, T, D={self.head_dim}) for this feature map, "
                f"got {tuple(x.shape)}"
            )
        if self.check_inputs:
            check_finite("x", x)

    @fp32_region()
    def log_features(self, x: Tensor, *, drop_row_constant: bool = False) -> Tensor:
        """log φ(x).

        Args:
            x: ``(B, H, T, D)`` queries or keys (after RoPE where the model has it).
            drop_row_constant: allow the result to be off by a constant per row (per token), e.g. the
                −‖x‖²/(2√d) term of the exponential maps. Such a constant cancels exactly in a normalised
                attention row, so the kernels use this for *queries*; never for keys.

        Returns:
            ``(B, H, T, M)`` in float32 (or float64 for float64 input), also under autocast.

        Raises:
            ValueError: wrong shape, or NaN input when ``check_inputs``.
        """
        return self._log_features(self._prepare_input(x), drop_row_constant)

    def _prepare_input(self, x: Tensor) -> Tensor:
        """Validate ``x`` and upcast half precision to float32 (features are exponentiated in float32)."""
        self._check_input(x)
        return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x

    @abstractmethod
    def _log_features(self, x: Tensor, drop_row_constant: bool) -> Tensor:
        """log φ(x) (up to a per-row constant if ``drop_row_constant``) for a validated float tensor."""

    @fp32_region()
    def attention_log_features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Log-features for attention: ``(ℓ_q, ℓ_k)`` with ℓ_q,f + ℓ_k,f = log φ_f(q) + log φ_f(k) + c(q).

        Every product φ_f(q)φ_f(k) is kept up to a per-query constant c(q), which cancels in a normalised
        attention row; maps may use that freedom to do less work on the query side.

        Args:
            q: ``(B, H, Tq, D)`` queries.
            k: ``(B, H, Tk, D)`` keys.

        Returns:
            ``(B, H, Tq, M)`` and ``(B, H, Tk, M)``.
        """
        return self.log_features(q, drop_row_constant=True), self.log_features(k)

    def forward(self, x: Tensor) -> Tensor:
        """φ(x) = exp(log φ(x)), ``(B, H, T, D) → (B, H, T, M)``. May under/overflow for large norms:
        the attention kernels use :meth:`log_features` instead."""
        return self.log_features(x).exp()

    def kernel(self, x: Tensor, y: Tensor) -> Tensor:
        """The approximate kernel K̂(x_i, y_j) = Σ_f φ_f(x_i) φ_f(y_j) for all pairs.

        Args:
            x: ``(B, H, T, D)``.
            y: ``(B, H, S, D)``.

        Returns:
            ``(B, H, T, S)``, computed as exp(logsumexp) so it is exact in float32 range.
        """
        lx, ly = self.log_features(x), self.log_features(y)
        return torch.logsumexp(lx.unsqueeze(-2) + ly.unsqueeze(-3), dim=-1).exp()

    def resize(self, feature_dim: int) -> None:
        """Change M, re-allocating the parameters (the first ``min(M_old, M_new)`` features are kept).

        Raises:
            ValueError: ``feature_dim`` is not a positive integer.
        """
        check_positive_int("feature_dim", feature_dim)
        if feature_dim != self.feature_dim:
            self._resize(feature_dim)
            self.feature_dim = feature_dim

    @abstractmethod
    def _resize(self, feature_dim: int) -> None:
        """Re-allocate parameters/buffers for ``feature_dim`` features."""


def exponential_log_features(x: Tensor, projection: Tensor, bias: Tensor | None, with_norm: bool) -> Tensor:
    """log φ(x) = x·W + b − ‖x‖²/(2√d) for the exponential feature maps (METHOD.md §1), in one ``baddbmm``.

    Args:
        x: ``(B, H, T, d)``.
        projection: ``(H, d, M)`` or ``(1, d, M)`` — W, already including the 1/d^¼ scale.
        bias: ``(H, 1, M)`` or ``(1, 1, M)`` — b, e.g. ½ log α − ½ log M; ``None`` for none.
        with_norm: add the −‖x‖²/(2√d) term (skip it for queries: it is a per-row constant).

    Returns:
        ``(B, H, T, M)`` in x's dtype.
    """
    B, H, T, d = x.shape
    M = projection.shape[-1]
    weight = projection.to(x.dtype).expand(B, H, d, M).reshape(B * H, d, M)
    rows = x.reshape(B * H, T, d)
    if bias is None and not with_norm:
        return torch.bmm(rows, weight).view(B, H, T, M)
    # The additive terms are written once, broadcast to (B, H, T, M); the matmul then accumulates into them
    # in place (a baddbmm with a broadcast bias would first copy it out, and ‖x‖² as x·x would allocate x²).
    if with_norm:
        shift = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square().mul_(-0.5 / math.sqrt(d))  # (B, H, T, 1)
        shift = shift + bias.to(x.dtype) if bias is not None else shift.expand(B, H, T, M).contiguous()
    else:
        shift = bias.to(x.dtype).expand(B, H, T, M).contiguous()
    return shift.view(B * H, T, M).baddbmm_(rows, weight).view(B, H, T, M)


def orthogonal_gaussian(
    num_heads: int, feature_dim: int, head_dim: int, generator: torch.Generator | None = None
) -> Tensor:
    """Orthogonal random features (FAVOR+, Choromanski et al. 2021, §2.4).

    Each head's M rows come in blocks of d mutually orthogonal directions, and each row is rescaled to
    the norm of an independent N(0, I_d) draw, so every row is marginally N(0, I_d): the positive random
    features stay unbiased for exp(xᵀy/√d), with lower variance than i.i.d. rows.

    Returns:
        ``(H, M, d)`` float32 (whatever the default dtype: QR has no half-precision kernel).
    """
    device = None if generator is None else generator.device  # a CPU generator draws on the CPU, also under a
    blocks = []  # default-device context (Lightning builds modules inside `with torch.device("cuda")`)
    for _ in range(math.ceil(feature_dim / head_dim)):
        gauss = torch.randn(num_heads, head_dim, head_dim, generator=generator, dtype=torch.float32, device=device)
        q, r = torch.linalg.qr(gauss)  # (H, d, d), orthonormal columns
        # Haar-distributed only after fixing the signs (Mezzadri 2007); without this the rows are not
        # uniform on the sphere and K̂ is biased.
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
        blocks.append(q.transpose(-1, -2))  # rows orthonormal
    directions = torch.cat(blocks, dim=1)[:, :feature_dim]  # (H, M, d)
    norms = torch.randn(num_heads, feature_dim, head_dim, generator=generator, dtype=torch.float32, device=device)
    norms = norms.norm(dim=-1, keepdim=True)
    return directions * norms
