"""Repeated spans: training blocks in which a stretch of the block's own text comes back later, beyond the window.

A student that keeps exact attention over a short window only learns to fetch something from far back if its
training text ever asks for it; in encyclopedic prose a long exact repeat is rare. :class:`RepeatedSpans` copies,
in a share of the training blocks, a span of ``L`` tokens of the block over the tokens ``distance`` or more
positions later (the block keeps its length; what was overwritten is gone). Past the first token or two of the
repeat, the teacher — whose induction heads see the whole block — predicts the rest of the span from the earlier
copy, and a student distilled against it is asked to do the same from beyond its window.

The repeat has no marker and no template: it is the text's own tokens at a random place, so what is trained is the
general ability to copy from far context (induction, Olsson et al. 2022, "In-context Learning and Induction Heads"),
never an evaluation's prompt format (lit_dof.evaluation.retrieval's passkey and recall prompts are not used).

Deterministic: the span of a block is drawn from a generator seeded by a key that names the block (its seed, rank,
dataloader role and index in that stream), so a resumed run, which replays the stream, draws the same spans.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SpanCopy:
    """One repeat written into a block: tokens ``[source, source + length)`` copied to ``[target, target + length)``
    (positions in tokens, ``target ≥ source + length + min_distance``)."""

    source: int
    target: int
    length: int


class RepeatedSpans:
    """Copy a span of a training block over a later stretch of the same block (see the module docstring).

    Args:
        share: fraction of training blocks that get repeats (each block is drawn independently; 0 turns it off).
        copies: repeats per chosen block (drawn one after another; a later one may overwrite an earlier one's
            tokens, source or target).
        min_length, max_length: span length in tokens, drawn uniformly from ``[min_length, max_length]``.
        min_distance: least distance in tokens from the end of the source span to the start of its repeat — set it
            beyond the student's window (plus its sinks) so that the repeat is fetched from the far part.

    Raises:
        ValueError: ``share`` outside ``[0, 1]``, ``copies`` < 1, ``min_length`` < 1, ``max_length`` <
            ``min_length``, or ``min_distance`` < 0 (at construction).
    """

    def __init__(
        self,
        share: float = 0.5,
        copies: int = 1,
        min_length: int = 8,
        max_length: int = 32,
        min_distance: int = 128,
    ) -> None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ValueError(f"repeated_spans share={share!r} must be a number in [0, 1]")
        counts = (("copies", copies, 1), ("min_length", min_length, 1), ("min_distance", min_distance, 0))
        for name, value, least in counts:
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"repeated_spans {name}={value!r} must be an integer >= {least}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < min_length:
            raise ValueError(f"repeated_spans max_length={max_length!r} must be an integer >= min_length={min_length}")
        self.share, self.copies = float(share), copies
        self.min_length, self.max_length, self.min_distance = min_length, max_length, min_distance

    def settings(self) -> dict:
        """The settings as plain values (what a checkpoint records: it loads with ``weights_only``)."""
        return {
            "share": self.share,
            "copies": self.copies,
            "min_length": self.min_length,
            "max_length": self.max_length,
            "min_distance": self.min_distance,
        }

    def min_block(self) -> int:
        """The shortest block (tokens) that holds a repeat of the longest span: ``2 · max_length + min_distance``."""
        return 2 * self.max_length + self.min_distance

    def check_block(self, seq_len: int) -> None:
        """Raise before any work if blocks of ``seq_len`` tokens cannot hold a repeat.

        Raises:
            ValueError: ``seq_len`` < :meth:`min_block`, naming both and the fix.
        """
        if seq_len < self.min_block():
            raise ValueError(
                f"repeated_spans needs blocks of >= 2 * max_length + min_distance = {self.min_block()} tokens, "
                f"the blocks have seq_len={seq_len}: raise --data.init_args.seq_len or lower "
                "repeated_spans' max_length / min_distance"
            )

    def draw(self, seq_len: int, key: str) -> list[SpanCopy]:
        """The repeats of the block named ``key`` (empty for a block not chosen).

        Args:
            seq_len: the block's length in tokens (≥ :meth:`min_block`).
            key: the block's name; the same key gives the same repeats.

        Returns:
            ``copies`` :class:`SpanCopy` records, or ``[]``.

        Raises:
            ValueError: ``seq_len`` too short (:meth:`check_block`).
        """
        self.check_block(seq_len)
        seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
        gen = torch.Generator().manual_seed(seed)
        if torch.rand((), generator=gen).item() >= self.share:
            return []
        out = []
        for _ in range(self.copies):
            length = int(torch.randint(self.min_length, self.max_length + 1, (), generator=gen))
            last_source = seq_len - 2 * length - self.min_distance  # ≥ 0 by check_block
            source = int(torch.randint(0, last_source + 1, (), generator=gen))
            first_target = source + length + self.min_distance
            target = int(torch.randint(first_target, seq_len - length + 1, (), generator=gen))
            out.append(SpanCopy(source, target, length))
        return out

    def __call__(self, block: torch.Tensor, key: str) -> torch.Tensor:
        """``block`` with its repeats written in (a new tensor; ``block`` is not changed).

        Args:
            block: token ids ``(T,)``.
            key: the block's name (:meth:`draw`).

        Returns:
            token ids ``(T,)``.
        """
        out = block.clone()
        for copy in self.draw(out.shape[0], key):
            out[copy.target : copy.target + copy.length] = out[copy.source : copy.source + copy.length].clone()
        return out

    def __repr__(self) -> str:
        return "RepeatedSpans(" + ", ".join(f"{k}={v}" for k, v in self.settings().items()) + ")"
