"""An exported student's decode state at a context length, against its teacher's fp32 KV cache there (issue #45's
bar: ≤ 25% at 4096 tokens).

    python tools/state_share.py STUDENT [STUDENT ...] [--context 4096]

Prints, per model, ``closed_form_state_bytes(model, T)`` (its state per sequence, counted from its shapes:
lit_dof.students.state_bytes), ``teacher_kv_nbytes(config, T, float32)`` (the teacher's ``DynamicCache``, from the
teacher config a student wraps) and their ratio. Nothing is run through the model; a plain model (a teacher) is
its own KV cache, 100%.
"""

from __future__ import annotations

import argparse

import torch

from lit_dof.evaluation.loading import load_model
from lit_dof.generation import teacher_kv_nbytes
from lit_dof.students.state_bytes import closed_form_state_bytes


def main(argv: list[str] | None = None) -> list[tuple[int, int]]:
    """Print each model's state against its teacher's KV cache; return ``(state bytes, teacher bytes)`` per model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("students", nargs="+", help="exported students (or any model lit-dof eval loads)")
    parser.add_argument("--context", type=int, default=4096, help="tokens of context (default 4096)")
    args = parser.parse_args(argv)
    sizes = []
    for source in args.students:
        model, _ = load_model(source)
        own = closed_form_state_bytes(model, args.context)
        config = getattr(model.config, "text_config", model.config)  # a student wraps its teacher's config
        teacher = teacher_kv_nbytes(config, args.context, torch.float32)
        print(
            f"{source}: {own / 2**20:.2f} MiB at {args.context} tokens; the teacher's fp32 KV cache "
            f"{teacher / 2**20:.2f} MiB; {own / teacher:.2%}"
        )
        sizes.append((own, teacher))
    return sizes


if __name__ == "__main__":
    main()
