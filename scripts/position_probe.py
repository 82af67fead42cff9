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

Usage: python scripts/position_probe.py STUDENT_DIR --corpus FILE [--shifts 0 1536 3584 7680] [--blocks 8]
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from transformers import AutoTokenizer

from lit_dof.evaluation.perplexity import heldout_documents, text_tokens
from lit_dof.students import load_student


@contextlib.contextmanager
def _without_far_terms(student):
    twins = [t for t in student.linear_modules().values() if hasattr(t, "far_term")]
    saved = [t.far_term for t in twins]
    for twin in twins:
        twin.far_term = False
    try:
        yield
    finally:
        for twin, far in zip(twins, saved):
            twin.far_term = far


def block_nll(student, blocks: torch.Tensor, shift: int, mode: str, first: int, batch_size: int = 4) -> torch.Tensor:
    """Mean NLL per block ``(N,)`` over positions ≥ ``first`` with position ids ``shift + arange(T)``.

    ``mode``: ``"teacher"``, ``"control"`` (far terms off) or ``"student"``.
    """
    modes = {"teacher": student.teacher_mode, "control": lambda: _without_far_terms(student),
             "student": contextlib.nullcontext}  # fmt: skip
    N, T = blocks.shape
    out = []
    with torch.no_grad(), modes[mode]():
        for i in range(0, N, batch_size):
            ids = blocks[i : i + batch_size]
            positions = (torch.arange(T) + shift).expand_as(ids)
            logits = student(ids, position_ids=positions, use_cache=False).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            out.append(nll[:, max(0, first - 1) :].mean(-1))
    return torch.cat(out)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student")
    parser.add_argument("--corpus", required=True, help="corpus file; its held-out documents are scored")
    parser.add_argument("--shifts", type=int, nargs="+", default=[0, 1536, 3584, 7680])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--from", dest="first", type=int, default=256, help="first scored position of a block")
    args = parser.parse_args(argv)
    student = load_student(args.student).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.student)
    tokens = text_tokens(heldout_documents(args.corpus), tokenizer, args.blocks * args.block)
    blocks = tokens[: tokens.numel() // args.block * args.block].view(-1, args.block)
    sliding = any(hasattr(t, "far_term") for t in student.linear_modules().values())
    modes = ["teacher", "control", "student"] if sliding else ["teacher", "student"]
    result = {}
    for shift in args.shifts:
        nll = {mode: block_nll(student, blocks, shift, mode, args.first) for mode in modes}
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
