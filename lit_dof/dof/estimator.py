"""Degrees of freedom of a head's attention kernel and the per-layer feature-dimension budget.

Paper: Nishikawa, Higuchi, Suzuki, "Degrees of Freedom for Linear Attention", NeurIPS 2025, Algorithm 1;
METHOD.md §2. Notation: J pooled query/key vectors x_i ∈ R^d of one head, s = √d, kernel
K(x, y) = exp(xᵀy/s), Gram G = [K(x_i, x_j)]/J, ridge λ > 0, degrees of freedom N_λ = tr G(G + λI)⁻¹.

Why not ``eigvalsh(G)``. On real teachers the scaled scores xᵀy/s reach far beyond 88, so G's entries
overflow float32 (e^88.7 is its largest value), and in float64 the eigenvalue noise floor eps·‖G‖ can sit
above the λ where layers differ, so a plain eigendecomposition cannot resolve N_λ there. We use the exact
factorisation (METHOD.md §2), which stays finite for any scores::

    exp(xᵀy/s) = e^{‖x‖²/2s} · e^{−‖x−y‖²/2s} · e^{‖y‖²/2s}   ⇒   G = D R D / J,

R = [exp(−‖x_i − x_j‖²/2s)] ∈ (0, 1] a bounded Gaussian-kernel Gram, D = diag(e^{‖x_i‖²/2s}), and::

    N_λ = J − λ tr (G + λI)⁻¹ = J − tr E (R/J + E)⁻¹,     E = λ D⁻² = diag(exp(log λ − ‖x_i‖²/s)).

E is formed from logarithms (never overflows), R/J + E is symmetric positive definite with unit-scale
off-diagonal entries, and each term e_i [(R/J + E)⁻¹]_ii lies in (0, 1] (clamped so), so N_λ ∈ [0, J].
One Cholesky factorisation and one triangular inverse per head: O(J³/3 + J³/3) operations.

Exact duplicates (e.g. the key of a BOS token sampled from several sequences) make R singular; they are
merged into one point of multiplicity w, which is exact: E becomes E/w.

Choosing λ. λ is not scale-free (METHOD.md §2). Hence three ways to give λ: absolute (the paper's;
``relative_to=None``), relative to the head's Gram scale (``"trace"``: λ·tr(G)/J, the mean eigenvalue;
``"max_eigenvalue"``: λ·μ_max), or automatic (:func:`select_lambda`: the absolute λ at which the mean layer
DoF is a target fraction of J). :func:`allocate_feature_dims` warns when an allocation is degenerate.

The λ rules' allocations on a real teacher (layer DoF and dims per rule) are printed by
``python scripts/dof_report.py``; the comparisons of λ rules in training are in
docs/results/lambda_study/README.md. ``tests/test_dof_report.py::test_smollm2_allocation_is_non_degenerate``
checks on SmolLM2-135M-Instruct that the paper's absolute λ = 2⁻⁴ saturates (near-uniform dims, warned) and that
the automatic and trace-relative rules give a non-degenerate allocation.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal, Sequence

import torch
from torch import Tensor

RelativeTo = Literal["trace", "max_eigenvalue"]
Strategy = Literal["dof", "dof_clip", "fix"]
STRATEGIES = ("dof", "dof_clip", "fix")


class DegenerateAllocationWarning(UserWarning):
    """The DoF allocation carries no information (uniform dims or saturated DoF): revisit λ or J."""


def _check_vectors(x: Tensor) -> Tensor:
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., J, d), got a {x.dim()}-d tensor")
    J = x.shape[-2]
    if J < 2:
        raise ValueError(f"the number of pooled vectors J must be >= 2, got J={J}")
    if x.shape[-1] < 1:
        raise ValueError("the head size d must be >= 1")
    x = x.double()
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or inf; the captured queries/keys are corrupt")
    return x


def _check_lambda(lam: float) -> float:
    lam = float(lam)
    if not (lam > 0 and math.isfinite(lam)):
        raise ValueError(f"the ridge lam must be a finite number > 0, got {lam!r}")
    return lam


def _log_d2(x: Tensor) -> Tensor:
    """‖x_i‖²/s = log D_ii², ``(..., J, d) → (..., J)``."""
    return (x * x).sum(-1) / math.sqrt(x.shape[-1])


def _factors(x: Tensor) -> tuple[Tensor, Tensor]:
    """The overflow-free factors ``(R, log_d2)`` of G = D R D / J (METHOD.md §2), without input checks.

    R ``(..., J, J)`` has entries exp(−‖x_i−x_j‖²/2s) ∈ (0, 1] and ``log_d2`` ``(..., J)`` = ‖x_i‖²/s = log D_ii², so
    log G_ij = ½log_d2_i + log R_ij + ½log_d2_j − log J. Any J ≥ 1, float64 input.
    """
    s = math.sqrt(x.shape[-1])
    sq = (x * x).sum(-1)  # (..., J)
    dist2 = (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * (x @ x.transpose(-1, -2))).clamp_min_(0.0)
    return torch.exp(-dist2 / (2.0 * s)), sq / s


def log_gram(x: Tensor) -> Tensor:
    """log G = log([exp(x_iᵀx_j/√d)]/J), ``(..., J, d) → (..., J, J)`` float64 — exact for any norm."""
    x = _check_vectors(x)
    return (x @ x.transpose(-1, -2)) / math.sqrt(x.shape[-1]) - math.log(x.shape[-2])


def _log_reference(x: Tensor, relative_to: RelativeTo | None) -> Tensor:
    """log of the Gram scale that a relative λ multiplies: 0, log(tr G / J) or log μ_max(G). ``(..., J, d) → (...)``,
    for checked float64 input."""
    J = x.shape[-2]
    if relative_to is None:
        return torch.zeros(x.shape[:-2], dtype=torch.float64, device=x.device)
    if relative_to == "trace":  # needs only the diagonal: tr G / J = Σ_i e^{‖x_i‖²/s} / J²
        return torch.logsumexp(_log_d2(x), dim=-1) - 2.0 * math.log(J)
    if relative_to == "max_eigenvalue":
        R, log_d2 = _factors(x)
        top = log_d2.amax(dim=-1, keepdim=True)
        half = torch.exp((log_d2 - top) / 2.0)  # D / max D ≤ 1
        scaled = half.unsqueeze(-1) * R * half.unsqueeze(-2) / J  # G · e^{−top}, entries ≤ 1
        mu = torch.linalg.eigvalsh(scaled)[..., -1]  # the top eigenvalue is resolved to full relative precision
        return torch.log(mu.clamp_min(torch.finfo(torch.float64).tiny)) + top.squeeze(-1)
    raise ValueError(f"relative_to must be None, 'trace' or 'max_eigenvalue', got {relative_to!r}")


def _dof_single(x: Tensor, log_lam: float, total: int, dedupe: bool) -> Tensor:
    """N_λ of one head, x ``(J, d)`` float64, via N = n − tr E'(R/J + E')⁻¹ on the n unique points."""
    if dedupe:
        x, counts = torch.unique(x, dim=0, return_counts=True)
        log_w = counts.double().log()
    else:
        log_w = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    n = x.shape[0]
    R, log_d2 = _factors(x)
    # e_i = λ / (w_i · e^{‖x_i‖²/s}); capped so that exp stays finite (such a point has ~0 DoF anyway).
    e = torch.exp((log_lam - log_d2 - log_w).clamp(max=700.0))
    A = R / total + torch.diag(e)
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        inv_diag = torch.cholesky_inverse(L).diagonal()
    else:  # numerically semi-definite (near-duplicate points with tiny ridge): eigen route, clamped
        mu, U = torch.linalg.eigh(A)
        inv_diag = (U * U / mu.clamp_min(torch.finfo(torch.float64).tiny)).sum(-1)
    ridge_mass = (e * inv_diag).clamp_(0.0, 1.0)  # each term is in (0, 1] exactly since A ⪰ E
    return n - ridge_mass.sum()


def degrees_of_freedom(
    x: Tensor,
    lam: float,
    *,
    relative_to: RelativeTo | None = None,
    dedupe: bool = True,
) -> Tensor:
    """Degrees of freedom N_λ = tr G(G + λI)⁻¹ of each head (paper Algorithm 1; METHOD.md §2).

    Args:
        x: ``(..., J, d)`` J vectors pooled from a head's queries and keys (post-RoPE), any float dtype;
            leading dims (e.g. ``(L, H)`` layers × heads) are batched.
        lam: the ridge λ > 0: absolute, or a multiplier of the head's Gram scale if ``relative_to`` is set.
        relative_to: ``None`` (absolute λ, the paper's), ``"trace"`` (λ·tr(G)/J) or ``"max_eigenvalue"``
            (λ·μ_max(G)). Relative ridges make heads of very different norm comparable.
        dedupe: merge exactly repeated vectors (exact; avoids a singular R).

    Returns:
        ``(...)`` float64 DoF, each in [0, J].

    Raises:
        ValueError: J < 2, λ ≤ 0 or not finite, NaN/inf in x, unknown ``relative_to``.
    """
    lam = _check_lambda(lam)
    x = _check_vectors(x)
    batch, (J, d) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape(-1, J, d)
    log_ref = _log_reference(flat, relative_to)  # (n_heads,)
    out = torch.stack([_dof_single(h, math.log(lam) + float(r), J, dedupe) for h, r in zip(flat, log_ref)])
    return out.reshape(batch)


def dof_eigvalsh(x: Tensor, lam: float) -> Tensor:
    """Reference N_λ = Σ_k μ_k/(μ_k + λ) from ``eigvalsh`` of G (max-scaled against overflow), ``(..., J, d) → (...)``.

    Only reliable when λ is well above the eigenvalue noise floor eps·μ_max — small norms, moderate λ.
    Used to test :func:`degrees_of_freedom` and to show where the plain route fails.
    """
    lg = log_gram(x)
    top = lg.amax(dim=(-1, -2), keepdim=True)
    mu = torch.linalg.eigvalsh(torch.exp(lg - top)).clamp_min(0.0)  # G / e^top
    scaled_lam = torch.exp(math.log(_check_lambda(lam)) - top.squeeze(-1))
    return (mu / (mu + scaled_lam)).sum(-1)


def layer_dof(head_dof: Tensor) -> Tensor:
    """Layer DoF N_s = max over the layer's heads (METHOD.md §2): ``(L, H) → (L,)``."""
    if head_dof.dim() != 2:
        raise ValueError(f"head_dof must have shape (L, H), got {tuple(head_dof.shape)}")
    return head_dof.amax(dim=-1)


_LOG2_LAMBDA_MAX = 1000.0
"""The largest log₂ λ :func:`select_lambda` tries (float64 holds λ up to ≈ 2^1024)."""


def select_lambda(
    x: Tensor,
    target_fraction: float = 0.25,
    *,
    search_samples: int | None = 256,
    log2_bounds: tuple[float, float] = (-40.0, 400.0),
    tolerance: float = 0.005,
    generator: torch.Generator | None = None,
) -> float:
    """Automatic absolute λ: the ridge at which the mean layer DoF equals ``target_fraction`` of J.

    Bisection on log₂ λ (N_λ decreases monotonically in λ). For speed it runs on a random subset of
    ``search_samples`` of the J vectors per head (the criterion is then that fraction of the subset size);
    pass ``search_samples=None`` to search at full J.

    Args:
        x: ``(L, H, J, d)`` pooled vectors of every head of every layer.
        target_fraction: in (0, 1); 0.25 keeps DoF well below J (no saturation) and above 1.
        search_samples: vectors per head used by the search (``None``: all J).
        log2_bounds: bracket for log₂ λ; its upper end is raised by steps of 100 (up to 1000, near float64's
            largest λ) while the DoF there is still above the target: N_λ falls monotonically in λ.
        tolerance: stop when the mean-layer-DoF fraction is within this of the target.
        generator: RNG for the subset.

    Returns:
        λ (absolute, float).

    Raises:
        ValueError: bad shapes or a target outside (0, 1), or a bracket that does not contain the target.
    """
    if x.dim() != 4:
        raise ValueError(f"x must have shape (L, H, J, d), got {tuple(x.shape)}")
    if not 0.0 < target_fraction < 1.0:
        raise ValueError(f"target_fraction must be in (0, 1), got {target_fraction}")
    J = x.shape[-2]
    if search_samples is not None and search_samples < J:
        device = None if generator is None else generator.device  # a CPU generator draws on the CPU
        idx = torch.randperm(J, generator=generator, device=device)[:search_samples].to(x.device)
        x = x[:, :, idx]
    n = x.shape[-2]

    def fraction(log2_lam: float) -> float:
        return float(layer_dof(degrees_of_freedom(x, 2.0**log2_lam)).mean()) / n

    lo, hi = log2_bounds
    f_lo, f_hi = fraction(lo), fraction(hi)
    while f_hi > target_fraction and hi < _LOG2_LAMBDA_MAX:  # a kernel of large scale (q/k of large norm)
        lo, f_lo, hi = hi, f_hi, min(hi + 100.0, _LOG2_LAMBDA_MAX)
        f_hi = fraction(hi)
    if not f_hi <= target_fraction <= f_lo:
        raise ValueError(
            f"target_fraction {target_fraction} is outside the DoF fractions [{f_hi:.3f}, {f_lo:.3f}] reached for "
            f"log2(lam) in {(log2_bounds[0], hi)}: use a relative λ (relative_to='trace') or widen log2_bounds"
        )
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        f_mid = fraction(mid)
        if abs(f_mid - target_fraction) <= tolerance:
            return 2.0**mid
        lo, hi = (mid, hi) if f_mid > target_fraction else (lo, mid)
    return 2.0 ** (0.5 * (lo + hi))


def allocate_feature_dims(
    layer_dof: Sequence[float] | Tensor,
    head_size: int,
    strategy: Strategy = "dof",
    *,
    multiple_of: int = 1,
    min_dim: int = 1,
    exact_budget: bool = False,
    num_samples: int | None = None,
) -> list[int]:
    """Per-layer feature dimensions M_s under the uniform budget L·C (METHOD.md §2).

    * ``"fix"``: M_s = C for every layer (the paper's Fix baseline).
    * ``"dof"``: M_s = round(C · N_s / mean_s N_s); the sum is L·C up to rounding (the paper's rule).
    * ``"dof_clip"``: the ``"dof"`` dims capped at C (total ≤ L·C).

    Args:
        layer_dof: ``(L,)`` per-layer DoF N_s (≥ 0, not all zero; a layer with N_s ≈ 0 gets ``min_dim``).
        head_size: C, the head size (the Fix dimension).
        strategy: ``"dof"``, ``"dof_clip"`` or ``"fix"``.
        multiple_of: round dims to multiples of this (kernel tiles); the total budget is then kept exactly
            by largest-remainder rounding.
        min_dim: smallest dimension any layer gets (≥ 1; rounded up to ``multiple_of``).
        exact_budget: make ``"dof"`` sum to exactly L·C (largest remainder) even with ``multiple_of=1``.
        num_samples: J used for the estimate; if given, layers with N_s ≥ 0.9·J trigger a warning.

    Returns:
        ``list[int]`` of length L.

    Warns:
        DegenerateAllocationWarning: every DoF-allocated layer is within ±5% of C, or some N_s ≥ 0.9·J.

    Raises:
        ValueError: unknown strategy, head_size/multiple_of/min_dim < 1, empty, negative or all-zero DoF.

    Example: the paper's GPT-2 Table 2 maxima (150, 173.8, 24.5, …) with C = 64 give 149, 172, 24, ….
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    for name, value in (("head_size", head_size), ("multiple_of", multiple_of), ("min_dim", min_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    dof = torch.as_tensor(layer_dof, dtype=torch.float64).flatten()
    if dof.numel() == 0:
        raise ValueError("layer_dof is empty: one DoF per layer is needed")
    if not (torch.isfinite(dof).all() and (dof >= 0).all() and dof.sum() > 0):
        raise ValueError(f"layer_dof must be finite, >= 0 and not all zero, got {dof.tolist()}")
    L = dof.numel()
    if strategy == "fix":
        return [head_size] * L

    if num_samples is not None and (dof >= 0.9 * num_samples).any():
        saturated = [i for i, n in enumerate(dof.tolist()) if n >= 0.9 * num_samples]
        warnings.warn(
            f"DoF of layers {saturated} is >= 0.9·J (J={num_samples}): the estimate is saturated. "
            "Increase lam (or use relative_to / select_lambda) or sample more vectors.",
            DegenerateAllocationWarning,
            stacklevel=2,
        )
    raw = head_size * dof / dof.mean()  # (L,)
    min_units = math.ceil(min_dim / multiple_of)
    if multiple_of == 1 and not exact_budget:
        dims = torch.floor(raw + 0.5).clamp_min(min_units).long()
    else:
        dims = _largest_remainder(raw / multiple_of, round(L * head_size / multiple_of), min_units) * multiple_of
    if strategy == "dof_clip":
        dims = dims.clamp_max(max(multiple_of, head_size // multiple_of * multiple_of))
    out = [int(m) for m in dims]
    if all(abs(m - head_size) <= 0.05 * head_size for m in out):
        warnings.warn(
            f"DoF allocation is uniform within ±5% of C={head_size} ({min(out)}…{max(out)}): the DoF carries no "
            "information at this lam. Try a larger lam, relative_to='trace', or select_lambda().",
            DegenerateAllocationWarning,
            stacklevel=2,
        )
    return out


def allocate_head_feature_dims(
    head_dof: Sequence[Sequence[float]],
    head_size: int,
    *,
    heads_per_map: int = 1,
    multiple_of: int = 1,
    min_dim: int = 1,
    num_samples: int | None = None,
) -> list[list[int]]:
    """Per-head feature dimensions (``"dof_head"``): M_{s,h} = round(C · N_{s,h} / mean N) over every feature map
    of every layer, so the budget is C per map on average — the paper's per-layer rule (METHOD.md §2)
    applied one level down, where the paper names it as future work (§6).

    Args:
        head_dof: per layer, the DoF of each pooled head (query heads or KV heads, see ``heads_per_map``).
        head_size: C, the mean dimension per feature map.
        heads_per_map: consecutive heads that share one feature map (the GQA group G when the DoF was pooled
            per query head and the maps are shared per KV head; 1 when they match); a map's DoF is the maximum
            over its heads, as a layer's is over its heads.
        multiple_of: as in :func:`allocate_feature_dims`.
        min_dim: as in :func:`allocate_feature_dims`.
        num_samples: as in :func:`allocate_feature_dims`.

    Returns:
        per layer, one M per feature map (``len(head_dof[s]) / heads_per_map`` entries).

    Raises:
        ValueError: a layer whose head count is not a multiple of ``heads_per_map``, or what
            :func:`allocate_feature_dims` raises.
    """
    if isinstance(heads_per_map, bool) or not isinstance(heads_per_map, int) or heads_per_map < 1:
        raise ValueError(f"heads_per_map must be an integer >= 1, got {heads_per_map!r}")
    per_map = []
    for s, row in enumerate(head_dof):
        row = list(row)
        if not row or len(row) % heads_per_map:
            raise ValueError(
                f"layer {s} has {len(row)} head DoF values, not a multiple of heads_per_map={heads_per_map}"
            )
        per_map.append([max(row[i : i + heads_per_map]) for i in range(0, len(row), heads_per_map)])
    flat = [x for row in per_map for x in row]
    dims = iter(
        allocate_feature_dims(flat, head_size, "dof", multiple_of=multiple_of, min_dim=min_dim, num_samples=num_samples)
    )
    return [[next(dims) for _ in row] for row in per_map]


def _largest_remainder(units: Tensor, total: int, min_units: int) -> Tensor:
    """Integers ≥ ``min_units`` close to ``units`` with sum ``total`` (Hamilton's method)."""
    base = torch.floor(units).long().clamp_min(min_units)
    short = total - int(base.sum())
    frac = units - torch.floor(units)
    if short > 0:
        base[torch.argsort(frac, descending=True)[:short]] += 1
    while short < 0:  # minimums overshot the budget: take from the largest allocations
        i = int(torch.argmax(base))
        if base[i] <= min_units:
            break
        base[i] -= 1
        short += 1
    return base
