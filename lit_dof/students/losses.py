"""Layer-wise distillation losses between a teacher's softmax attention and a linear twin (METHOD.md §3).

Both losses take one layer's captured teacher queries/keys (post-RoPE, queries scaled to the qᵀk/√d
convention, :func:`lit_dof.interface.effective_query`) and the layer's linear twin; only the twin's
feature-map parameters receive gradients. Notation: B batch, Hq query heads, Hk KV heads, T tokens,
R ≤ T scored query rows, M features, d head size.

* **softmax** (paper §3, "softmax loss"): cross-entropy between the teacher's causal attention rows
  p_i = softmax_{j≤i}(q_iᵀk_j/√d) and the twin's normalised rows p̂_i ∝ K̂(q_i, k_j), averaged over rows
  and heads. We return KL(p‖p̂) = CE − H(p): the same gradient, and 0 at a perfect match. For a
  sliding-window twin (:class:`~lit_dof.attention.SlidingWindowLinearAttention`) p̂_i is its whole row —
  exact softmax terms on the window and sinks, e^β K̂ on older keys, one normaliser — so the feature map
  and β learn exactly what the window leaves unexplained.
* **output** (:func:`attention_output_loss`, Distill-then-Replace's blockwise objective): relative squared
  error of the twin's attention output against the teacher's, on the teacher's q/k/v.
* **l2** (paper §3, "L2 loss"): mean squared error between K(q, k) = exp(qᵀk/√d) and K̂(q, k) over all
  pairs of valid tokens (not only causal ones, as in the paper). Real teachers have kernel values up to
  e^160, so it is computed in float64 (e^320 squared errors stay finite); Adam is insensitive to the scale.

Every loss computes in float32 (float64 where stated) with autocast off (:func:`lit_dof.precision.fp32_region`),
whatever the trainer's precision: half-precision inputs are upcast first, and the result is float32.

The layer-wise phase takes these losses as objects (:mod:`lit_dof.students.layer_losses`).

``query_rows`` scores a random subset of R query rows per sequence (each row's loss is independent of the
others given the keys), cutting the O(T²) cost by T/R — an unbiased estimate of the full-row loss; drawn by
position strata instead (:class:`~lit_dof.students.query_rows.StratifiedRows`), it weights the strata equally.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from lit_dof.attention import CausalLinearAttention, SlidingWindowLinearAttention
from lit_dof.attention.layers.exact import ExactAttention
from lit_dof.attention.layers.grouped import HeadGroupedAttention
from lit_dof.attention.ops.rotary import Rotary
from lit_dof.attention.ops.sliding_window.naive import sliding_window_masks
from lit_dof.precision import fp32_region, upcast
from lit_dof.students.query_rows import StratifiedRows, select_rows

KernelLossKind = Literal["softmax", "l2"]
"""The losses :func:`attention_distillation_loss` computes (the output loss is :func:`attention_output_loss`)."""


def _twin_log_features(twin: CausalLinearAttention, q: Tensor, k: Tensor, exact: bool) -> tuple[Tensor, Tensor]:
    """log φ(q) ``(B, Hq, R, M)`` and log φ(k) ``(B, Hq, T, M)`` (keys expanded to query heads).

    ``exact``: keep every constant (the L2 loss needs K̂ itself, not only normalised rows).
    """
    B, Hq, R, d = q.shape
    G = twin.num_heads // twin.num_kv_heads
    fm = twin.feature_map
    if not exact:
        log_q, log_k = twin.log_features(q, k)
    elif twin.shares_kv_maps:
        log_q = fm.log_features(q.reshape(B, twin.num_kv_heads, G * R, d)).view(B, Hq, R, -1)
        log_k = fm.log_features(k)
    else:
        log_q, log_k = fm.log_features(q), fm.log_features(k.repeat_interleave(G, dim=1))
    if log_k.shape[1] != Hq:
        log_k = log_k.repeat_interleave(G, dim=1)
    return log_q, log_k


@fp32_region()
def log_kernel_scores(log_q: Tensor, log_k: Tensor) -> Tensor:
    """log K̂(q_i, k_j) = log Σ_f exp(ℓ_q,if + ℓ_k,jf) for all pairs: ``(B, H, R, M), (B, H, T, M) → (B, H, R, T)``.

    Row and column maxima are taken out before the matmul (every exponential ≤ 1), which runs in float64:
    a pair is exact as long as its dominant feature is within ~700 nats of both maxima (float32 would
    give ~87, too little for heavy-tailed learned features). A pair below that underflows to
    log(float64 tiny) ≈ −708 instead of −∞ (its gradient is then zero). Returned in float32.
    """
    log_q, log_k = log_q.double(), log_k.double()
    a = log_q.detach().amax(dim=-1, keepdim=True)  # (B, H, R, 1)
    b = log_k.detach().amax(dim=-1, keepdim=True)  # (B, H, T, 1)
    x = torch.exp(log_q - a) @ torch.exp(log_k - b).transpose(-1, -2)  # (B, H, R, T)
    return (torch.log(x.clamp_min(torch.finfo(x.dtype).tiny)) + a + b.transpose(-1, -2)).float()


@fp32_region()
def attention_distillation_loss(
    twin: CausalLinearAttention,
    q: Tensor,
    k: Tensor,
    key_padding: Tensor | None = None,
    *,
    kind: KernelLossKind = "softmax",
    query_rows: int | StratifiedRows | None = None,
    generator: torch.Generator | None = None,
    rotary: Rotary | None = None,
    values: Tensor | None = None,
) -> Tensor:
    """One layer's distillation loss (scalar) of ``twin`` against the teacher's attention on q, k.

    Args:
        twin: the layer's :class:`~lit_dof.attention.CausalLinearAttention` (its feature map gets gradients).
        q: ``(B, Hq, T, d)`` teacher queries (scaled, post-RoPE).
        k: ``(B, Hk, T, d)`` teacher keys.
        key_padding: ``(B, T)`` bool, False at padding (padding rows and columns are excluded).
        kind: ``"softmax"`` (KL of attention rows) or ``"l2"`` (squared kernel error, float64).
        query_rows: score this many random query rows per sequence (``None``: all T), or rows drawn by position
            strata (:class:`~lit_dof.students.query_rows.StratifiedRows`).
        generator: RNG for the row subset.
        rotary: the teacher's rotary ``(cos, sin)`` of the T positions; needed by a twin whose far term sees
            un-rotated q/k (``needs_rotary``).
        values: ``(B, Hk, T, D)`` teacher values; needed by a twin whose far memory has a forget gate
            (``far_gated``: the gate reads them).

    Returns:
        a 0-d float32 tensor.

    Raises:
        ValueError: unknown ``kind``, ``l2`` for a sliding-window twin, a sliding-window twin without a far
            term, one that needs ``rotary`` without it, a gated one without ``values``, or one with a delta-rule
            far memory (no attention rows); a per-head layer whose every KV head is exact.
        FloatingPointError: a non-finite loss (names the layer's inputs).
    """
    if kind not in ("softmax", "l2"):
        raise ValueError(f"loss kind must be 'softmax' or 'l2', got {kind!r}")
    if isinstance(twin, HeadGroupedAttention):  # per-head dims: each linear group on its heads, weighted by heads
        options = {"kind": kind, "query_rows": query_rows, "generator": generator, "rotary": rotary}
        total, counted = 0.0, 0
        for layer, qg, kg, *vg, heads in twin.split(q, k, *(() if values is None else (values,))):
            if isinstance(layer, ExactAttention):
                continue  # the exact heads are the teacher's: nothing to distil
            part = attention_distillation_loss(layer, qg, kg, key_padding, values=next(iter(vg), None), **options)
            total, counted = total + part * len(heads), counted + len(heads)
        if not counted:
            raise ValueError("every KV head of this layer is exact (feature dim 0): it has nothing to distil")
        return total / counted
    windowed = isinstance(twin, SlidingWindowLinearAttention)
    if windowed and kind == "l2":
        raise ValueError("the l2 kernel loss is not defined for sliding-window twins: use loss 'softmax' or 'output'")
    if windowed and not twin.far_term:
        raise ValueError("a sliding-window twin without a far term has nothing to distil (its KL is infinite)")
    if windowed and twin.far_delta:
        raise ValueError(
            "a delta-rule far memory (sliding_window.far_memory: delta) has no attention rows to distil: train it "
            "with the output loss (model.init_args.loss: lit_dof.students.layer_losses.OutputLoss)"
        )
    if windowed and twin.sliding_window.far_cache:
        raise ValueError(
            "an exact far cache (sliding_window.far_cache) changes which far pairs are exact, which the windowed "
            "softmax rows do not model: train it with the output loss (model.init_args.loss: "
            "lit_dof.students.layer_losses.OutputLoss)"
        )
    if windowed and twin.far_gated and values is None:
        raise ValueError(
            "this twin's far memory has a forget gate that reads the values (sliding_window.far_gate): pass the "
            "teacher's values (the layer-wise capture keeps them for gated twins)"
        )
    B, T = q.shape[0], q.shape[2]
    q, k = q.detach(), k.detach()
    rows = select_rows(T, query_rows, generator, q.device)
    valid = torch.ones(B, T, dtype=torch.bool, device=q.device) if key_padding is None else key_padding.bool()
    # A causal row attends to no later key: rows drawn by strata are scored stratum by stratum on the prefix that
    # ends there (the same sums, without the keys a stratum's rows cannot see). The l2 loss scores every key.
    stratified = isinstance(query_rows, StratifiedRows) and kind == "softmax"
    stops = [stop for _, stop in query_rows.strata(T)] if stratified else [T]
    total, count, start = 0.0, torch.zeros(()), 0
    for stop in stops:
        part = rows[(rows >= start) & (rows < stop)]
        if len(part):
            cut_rotary = None if rotary is None else tuple(t[:, :stop] for t in rotary)
            cut_values = None if values is None else values[:, :, :stop]
            prefix = (q[:, :, :stop], k[:, :, :stop], valid[:, :stop])
            sums = _row_sums(twin, *prefix, part, kind, windowed, cut_rotary, cut_values)
            total, count = total + sums[0], count + sums[1]
        start = stop
    loss = (total / count.clamp_min(1)).float()
    if not torch.isfinite(loss):
        raise FloatingPointError(
            f"non-finite {kind} distillation loss ({loss.item()}); check the teacher's q/k (max |q| "
            f"{q.abs().max().item():.3g}, max |k| {k.abs().max().item():.3g}) and the feature map's parameters"
        )
    return loss


def _row_sums(
    twin, q: Tensor, k: Tensor, valid: Tensor, rows: Tensor, kind: str, windowed: bool, rotary, values
) -> tuple[Tensor, Tensor]:
    """The loss summed over the scored ``rows`` of q ``(B, Hq, T, d)``, k ``(B, Hk, T, d)`` and what it averages
    over (valid rows × heads for softmax, valid pairs × heads for l2), each a 0-d tensor; ``valid`` ``(B, T)``."""
    B, Hq, T, d = q.shape
    G = q.shape[1] // k.shape[1]
    q_r = q[:, :, rows]
    row_valid = valid[:, rows]  # (B, R)
    k_full = k.repeat_interleave(G, dim=1)
    logits = (
        (q_r.double() if kind == "l2" else q_r.float())
        @ k_full.to(torch.float64 if kind == "l2" else torch.float32).transpose(-1, -2)
        / math.sqrt(d)
    )  # (B, Hq, R, T)
    log_khat = None
    if not windowed or twin.far_term:
        q_far, k_far = twin.far_inputs(q, k, rotary) if windowed else (q, k)
        log_q, log_k = _twin_log_features(twin, q_far[:, :, rows], k_far, exact=kind == "l2" or windowed)
        rates = twin.decay_rates(per_query_head=True) if windowed else None
        if rates is not None and rates.dim() == 2:  # a decay per feature: e^{−λ_f (i − w − j)} inside the sum
            positions = torch.arange(T, device=q.device, dtype=torch.float32)
            rates = rates.to(q.device)[None, :, None, :]  # (1, Hq, 1, M)
            log_q = log_q.float() - rates * (positions[rows] - twin.window)[None, None, :, None]
            log_k = log_k.float() + rates * positions[None, None, :, None]
        log_khat = log_kernel_scores(log_q.float(), log_k.float())
    if kind == "softmax":
        causal = rows[:, None] >= torch.arange(T, device=q.device)[None, :]  # (R, T)
        allowed = (causal[None] & valid[:, None, :])[:, None]  # (B, 1, R, T)
        log_p = logits.masked_fill(~allowed, float("-inf")).log_softmax(-1)
        if windowed:
            log_khat = _windowed_scores(twin, logits, log_khat, rows, T, values)
        log_phat = log_khat.masked_fill(~allowed, float("-inf")).log_softmax(-1)
        p = log_p.exp()
        kl = (p * (log_p - log_phat)).masked_fill(~allowed, 0.0).sum(-1)  # (B, Hq, R)
        weights = row_valid[:, None, :].expand_as(kl).float()
        return (kl * weights).sum(), weights.sum()
    pair = (row_valid[:, :, None] & valid[:, None, :])[:, None]  # (B, 1, R, T)
    err = (logits.exp() - log_khat.double().exp()).pow(2).masked_fill(~pair, 0.0)
    return err.sum(), (pair.sum() * Hq).double()  # float64: squared kernel errors reach e^320


def _windowed_scores(
    twin: SlidingWindowLinearAttention,
    logits: Tensor,
    log_khat: Tensor | None,
    rows: Tensor,
    T: int,
    values: Tensor | None = None,
) -> Tensor:
    """The log-terms of a sliding-window twin's rows ``(B, Hq, R, T)``: the teacher's logits on exact pairs,
    ``β_h − λ_h (i − w − j) + Σ_{j+w<t≤i} g_ht + log K̂`` on far pairs (a decay per feature is already inside
    ``log_khat``, log Σ_f φ_f φ_f e^{−λ_hf (i − w − j)}; g: the forget gates the twin reads from
    ``values`` ``(B, Hk, T, D)``), ``-inf`` elsewhere
    (:func:`~lit_dof.attention.ops.sliding_window.naive.sliding_window_masks`)."""
    exact, far = (m[rows] for m in sliding_window_masks(T, twin.window, twin.sink_tokens, device=logits.device))
    scores = torch.full_like(logits, float("-inf"))
    if log_khat is not None:
        if twin.log_mix is not None:
            log_khat = log_khat + twin.log_mix.float()[None, :, None, None]
        rates = twin.decay_rates(per_query_head=True)
        if rates is not None and rates.dim() == 1:  # e^{−λ (i − w − j)} on far pairs (per feature: in log_khat)
            beyond = (rows[:, None] - twin.window - torch.arange(T, device=logits.device)).float()  # (R, T)
            log_khat = log_khat - rates.to(logits.device)[None, :, None, None] * beyond
        if twin.far_gated:  # Σ_{j+w<t≤i} g_t = c_i − c_{j+w}, c the inclusive cumulative sum over positions
            group = twin.num_heads // twin.num_kv_heads
            v = values.float() if twin.shares_kv_maps else values.float().repeat_interleave(group, dim=1)
            c = twin.far_log_gates(v, per_query_head=True).cumsum(-1)  # (B, Hq, T)
            left = c[:, :, (torch.arange(T, device=c.device) + twin.window).clamp_max(T - 1)]  # c_{j+w}
            log_khat = log_khat + c[:, :, rows, None] - left[:, :, None, :]
        scores = log_khat.masked_fill(~far, float("-inf"))
    return torch.where(exact, logits, scores)


@fp32_region()
def output_error_sums(
    twin: CausalLinearAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    key_padding: Tensor | None = None,
    rotary: Rotary | None = None,
) -> tuple[Tensor, Tensor]:
    """Σ‖ŷ − y‖² and Σ‖y‖² over the valid rows and heads of one block (shapes as :func:`attention_output_loss`),
    as 0-d float32 tensors: the loss is their ratio; sums over several batches give the pooled ratio. A per-head
    layer's exact heads (the teacher's own attention) are left out of both sums."""
    if isinstance(twin, HeadGroupedAttention) and twin.exact_heads:
        sums = [
            output_error_sums(layer, qg, kg, vg, out.index_select(2, heads), key_padding, rotary)
            for layer, qg, kg, vg, heads in twin.split(q, k, v)
            if not isinstance(layer, ExactAttention)
        ]
        if not sums:
            raise ValueError("every KV head of this layer is exact (feature dim 0): it has nothing to distil")
        return sum(e for e, _ in sums), sum(n for _, n in sums)
    q, k, v = (upcast(t.detach()) for t in (q, k, v))  # the twin returns y in v's dtype: float32 here
    y, _ = twin(q, k, v, key_padding_mask=key_padding, rotary=rotary)  # (B, Hq, T, D)
    target = out.detach().transpose(1, 2).float()
    err = (y.float() - target).pow(2).sum(-1)  # (B, Hq, T)
    norm = target.pow(2).sum(-1)
    if key_padding is not None:
        rows = key_padding.bool()[:, None, :].float()
        err, norm = err * rows, norm * rows
    return err.sum(), norm.sum()


def attention_output_loss(
    twin: CausalLinearAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    key_padding: Tensor | None = None,
    rotary: Rotary | None = None,
) -> Tensor:
    """Output-matching loss of one attention block (Distill-then-Replace's blockwise local distillation,
    arXiv 2601.11667 §3.1): the twin's linear attention on the teacher's own q, k, v against the teacher's
    softmax attention output, as a relative squared error Σ‖ŷ − y‖² / Σ‖y‖² over valid rows and heads.

    Unlike the kernel losses it sees the values, so it weighs each attention error by what it changes in the
    block's output; it is scale-free (0 at a perfect match, 1 for an all-zero output).

    Args:
        twin: the layer's :class:`~lit_dof.attention.CausalLinearAttention`.
        q: ``(B, Hq, T, d)`` teacher queries (scaled, post-RoPE).
        k: ``(B, Hk, T, d)`` teacher keys.
        v: ``(B, Hk, T, D)`` teacher values.
        out: ``(B, T, Hq, D)`` the teacher's attention output before the output projection (as captured).
        key_padding: ``(B, T)`` bool, False at padding (those rows and keys are excluded).
        rotary: the teacher's rotary ``(cos, sin)`` of the T positions (for a twin that ``needs_rotary``).

    Returns:
        a 0-d float32 tensor.

    Raises:
        ValueError: a per-head layer whose every KV head is exact.
        FloatingPointError: a non-finite loss.
    """
    err, norm = output_error_sums(twin, q, k, v, out, key_padding, rotary)
    loss = err / norm.clamp_min(torch.finfo(torch.float32).tiny)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite output-matching loss ({loss.item()}); check the twin's feature map")
    return loss


@fp32_region()
def logit_distillation_loss(
    student_logits: Tensor, teacher_logits: Tensor, attention_mask: Tensor | None = None, *, temperature: float = 1.0
) -> Tensor:
    """Per-token KL(teacher ‖ student) of next-token distributions (Hinton et al. 2015, "Distilling the
    Knowledge in a Neural Network", eq. 2, with the usual T² gradient scale).

    Args:
        student_logits: ``(B, T, V)`` (any float dtype; computed in float32).
        teacher_logits: ``(B, T, V)``, the target distribution.
        attention_mask: ``(B, T)``, 0 at padding (those positions are excluded); ``None``: all count.
        temperature: softmax temperature T > 0.

    Returns:
        a 0-d float32 tensor: the mean over valid tokens of T² · KL(p_teacher^T ‖ p_student^T), in nats.

    Raises:
        ValueError: mismatched shapes or a non-positive temperature.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} differ in shape"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    log_q = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p = torch.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (B, T)
    if attention_mask is None:
        return kl.mean() * temperature**2
    weights = attention_mask.to(kl.dtype)
    return (kl * weights).sum() / weights.sum().clamp_min(1.0) * temperature**2
