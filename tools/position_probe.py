"""Diagnostic: does a student depend on *absolute* positions where its teacher does not?

Rotary position encodings make a teacher's attention a function of relative positions only: the same block of
tokens scored with position ids shifted by s (``s, s + 1, …``) gets the same logits. A linear or sliding-window +
linear student applies its feature maps φ to post-RoPE queries and keys, whose absolute rotation learned maps
are not invariant to, so a student trained on positions 0 … T − 1 can lose quality at large positions even on
text it handles well at small ones — the out-of-distribution part of long-context degradation, separated from
the number of far keys (which a shift leaves unchanged).

For ``--blocks`` held-out blocks of ``--block`` tokens and every shift, prints the mean next-token NLL (nats) over
positions ≥ ``--from`` of the block for the teacher (the student in teacher mode), the control (the student's
window and sinks without the far term; sliding-window students only) and the student, with the student's
difference to the control and its standard error over blocks.

``--unrotate-period P`` (Llama-style full rotary embeddings only) tries a remedy without retraining: before the
far term's feature maps, the RoPE dimension pairs whose period 2π/ω exceeds P tokens are rotated back by the
token's absolute position (their angle set to that of position 0), so the maps see, on those slow pairs, the
orientations of training; the exact window is untouched (the rotary idea of keeping only the faster frequencies
is p-RoPE, Barbero et al. 2025, "Round and round we go! What makes rotary positional encodings useful?", §5).

``--contexts 2048 8192 …`` instead scores blocks of those lengths from position 0 (the comparison's ``long`` stage:
held-out documents concatenated, up to 16,384 tokens) for the student (with the remedy, if given) and the control,
and prints their paired perplexity ratio overall and in the last position bucket.

Usage: python tools/position_probe.py STUDENT_DIR --corpus FILE [--shifts 0 1536 3584 7680] [--blocks 8]
       [--unrotate-period P] [--contexts 512 2048 4096 8192] [--device auto|cpu|cuda[:N]]
       [--dtype auto|float32|bfloat16|float16]
``--device`` / ``--dtype`` as for ``lit-dof eval`` (lit_dof.devices; auto: CUDA when available, the recorded dtype).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch
from transformers import AutoTokenizer
from transformers.models.llama.modeling_llama import rotate_half

from lit_dof.attention.layers.sliding_window import SlidingWindowLinearAttention
from lit_dof.devices import DEVICE_OPTIONS, DTYPE_OPTIONS, device_errors_exit, resolve_device, resolve_model_dtype
from lit_dof.evaluation.perplexity import heldout_documents, text_tokens
from lit_dof.students import load_student


@contextlib.contextmanager
def _without_far_terms(student):
    layers = [m for m in student.modules() if isinstance(m, SlidingWindowLinearAttention)]
    saved = [layer.sliding_window for layer in layers]
    for layer in layers:
        layer.sliding_window = dataclasses.replace(layer.sliding_window, far_term=False)
    try:
        yield
    finally:
        for layer, options in zip(layers, saved):
            layer.sliding_window = options


def _rotary_frequencies(student) -> torch.Tensor:
    """ω ``(d / 2,)`` of the student's rotary embedding; raises for anything but full Llama-style rotary."""
    rotary = getattr(getattr(student.model, "model", None), "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    config = student.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if inv_freq is None or 2 * inv_freq.numel() != head_dim:
        raise ValueError("--unrotate-period needs a model with full (Llama-style) rotary embeddings")
    return inv_freq.float()


@contextlib.contextmanager
def unrotated_far_features(student, period: float, positions: torch.Tensor):
    """Within the block: the far terms' feature maps see q/k whose RoPE pairs with period > ``period`` tokens are
    rotated back by ``positions`` ``(T,)`` (rotate-half layout: pair i is dims i and i + d/2)."""
    omega = _rotary_frequencies(student)
    slow = (2 * torch.pi / omega > period).float()

    def unrotate(x: torch.Tensor) -> torch.Tensor:  # (B, H, T, d) at positions[-T:]
        angle = (positions[-x.shape[-2] :, None].float().to(omega.device) * (omega * slow)[None, :]).to(x.device)
        cos, sin = torch.cat([angle.cos()] * 2, -1).to(x.dtype), torch.cat([angle.sin()] * 2, -1).to(x.dtype)
        return x * cos - rotate_half(x) * sin  # R(−θ) x: transformers' RoPE with the angle negated

    def patched(original):
        return lambda q, k: original(unrotate(q), unrotate(k))

    twins = [t for t in student.linear_modules().values() if hasattr(t, "exact_log_features")]
    if any(t.needs_rotary for t in twins):
        raise ValueError("--unrotate-period: this student's far terms see un-rotated q/k already (far_rope=False)")
    for twin in twins:
        twin.exact_log_features = patched(twin.exact_log_features)
    try:
        yield
    finally:
        for twin in twins:
            del twin.exact_log_features  # back to the class's method


def block_nll(student, blocks: torch.Tensor, shift: int, mode: str, first: int, batch_size: int = 4,
              unrotate_period: float | None = None) -> torch.Tensor:  # fmt: skip  # packed signature
    """Mean NLL per block ``(N,)`` over positions ≥ ``first`` with position ids ``shift + arange(T)``.

    ``mode``: ``"teacher"``, ``"control"`` (far terms off) or ``"student"``; ``unrotate_period``: see the module
    docstring (student mode only).
    """
    modes = {
        "teacher": student.teacher_mode,
        "control": lambda: _without_far_terms(student),
        "student": contextlib.nullcontext,
    }
    N, T = blocks.shape
    device = next(student.parameters()).device
    blocks = blocks.to(device)
    out = []
    remedy = contextlib.nullcontext()
    if unrotate_period is not None and mode == "student":
        remedy = unrotated_far_features(student, unrotate_period, torch.arange(T) + shift)
    with torch.no_grad(), modes[mode](), remedy:
        for i in range(0, N, batch_size):
            ids = blocks[i : i + batch_size]
            positions = (torch.arange(T, device=device) + shift).expand_as(ids)
            logits = student(ids, position_ids=positions, use_cache=False).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            out.append(nll[:, max(0, first - 1) :].mean(-1).cpu())
    return torch.cat(out)


def long_context(student, tokens: torch.Tensor, contexts, unrotate_period: float | None) -> dict:
    """Student vs control by position at each context (blocks from position 0); paired ratios, as printed."""
    from lit_dof.evaluation.position_perplexity import paired_perplexity_ratio, position_edges, position_perplexity

    result = {}
    for context in contexts:
        edges = position_edges(context)
        usable = tokens[: max(context, tokens.numel() // context * context)]
        remedy = (
            unrotated_far_features(student, unrotate_period, torch.arange(context))
            if unrotate_period is not None
            else contextlib.nullcontext()
        )
        with torch.no_grad(), remedy:
            mine = position_perplexity(student, usable, block=context, edges=edges, batch_size=1)
        with torch.no_grad(), _without_far_terms(student):
            control = position_perplexity(student, usable, block=context, edges=edges, batch_size=1)
        last = f"{edges[-2]}-{edges[-1] - 1}"
        overall, tail = paired_perplexity_ratio(mine, control), paired_perplexity_ratio(mine, control, last)
        print(
            f"context {context:5d} ({overall['blocks']} blocks): student / control {overall['ratio']:.3f} ± "
            f"{overall['stderr_log']:.3f} (log), positions {last}: {tail['ratio']:.3f} ± {tail['stderr_log']:.3f}",
            flush=True,
        )
        result[context] = {"student": mine, "control": control, "ratio": overall, "ratio_last": tail}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student")
    parser.add_argument("--corpus", required=True, help="corpus file; its held-out documents are scored")
    parser.add_argument("--shifts", type=int, nargs="+", default=[0, 1536, 3584, 7680])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--from", dest="first", type=int, default=256, help="first scored position of a block")
    parser.add_argument(
        "--unrotate-period",
        type=float,
        default=None,
        help="un-rotate the far features' RoPE pairs slower than this many tokens (see above)",
    )
    parser.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        default=None,
        help="score blocks of these lengths from position 0 instead of shifted blocks",
    )
    parser.add_argument("--device", default="auto", help=f"where the student runs: {DEVICE_OPTIONS}")
    parser.add_argument(
        "--dtype", default="auto", choices=DTYPE_OPTIONS, help="its weights' dtype (auto: the recorded one)"
    )
    args = parser.parse_args(argv)
    with device_errors_exit("position_probe.py"):  # a bad value: a usage error, before the student loads
        device, dtype = resolve_device(args.device), resolve_model_dtype(args.dtype)
    student = load_student(args.student, **({"dtype": dtype} if dtype is not None else {})).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    if args.contexts:
        tokens = text_tokens(heldout_documents(args.corpus), tokenizer, max(16384, max(args.contexts)))
        return long_context(student, tokens, args.contexts, args.unrotate_period)
    tokens = text_tokens(heldout_documents(args.corpus), tokenizer, args.blocks * args.block)
    blocks = tokens[: tokens.numel() // args.block * args.block].view(-1, args.block)
    sliding = any(hasattr(t, "far_term") for t in student.linear_modules().values())
    modes = ["teacher", "control", "student"] if sliding else ["teacher", "student"]
    result = {}
    for shift in args.shifts:
        nll = {
            mode: block_nll(student, blocks, shift, mode, args.first, unrotate_period=args.unrotate_period)
            for mode in modes
        }
        row = {mode: v.mean().item() for mode, v in nll.items()}
        line = f"shift {shift:6d}: " + "  ".join(f"{m} {v:.4f}" for m, v in row.items())
        if sliding:
            diff = nll["student"] - nll["control"]
            row["student_minus_control"] = diff.mean().item()
            row["se"] = (diff.std() / len(diff) ** 0.5).item() if len(diff) > 1 else float("nan")
            line += f"  student − control {row['student_minus_control']:+.4f} ± {row['se']:.4f}"
        print(line, flush=True)
        result[shift] = row
    return result


if __name__ == "__main__":
    main()
