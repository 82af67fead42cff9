"""The order in which a training stream reads its documents: file (or hub) order, or a seeded shuffle.

Independent fits — the unit of evidence — differ in their feature initialisation *and* their data order. A
corpus streamed document by document has no index to permute, so :func:`buffer_shuffle` shuffles it through a
buffer of ``buffer`` documents (as ``datasets``' ``IterableDataset.shuffle`` does): each document read replaces
one drawn at random from the buffer, which is emptied in random order at the end. Deterministic in its seed, it
replays exactly — so a resumed run, which replays the stream and skips what it consumed, continues the same
order, and every rank and dataloader worker shuffles its own share with its own generator.
"""

from __future__ import annotations

import random
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def buffer_shuffle(items: Iterable[T], buffer: int, seed: str) -> Iterator[T]:
    """``items`` in a pseudo-random order: a shuffle through a buffer of ``buffer`` items.

    An item can move up to about ``buffer`` places earlier and arbitrarily later; with ``buffer`` ≥ the number
    of items it is a uniform random permutation.

    Args:
        items: the stream (read once, lazily).
        buffer: items held at once (≥ 1; 1 keeps the order).
        seed: the generator's seed (a string: hashed stably by ``random.Random``, e.g. ``"3/rank0/worker1"``).

    Yields:
        every item once.

    Raises:
        ValueError: ``buffer`` < 1.
    """
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ValueError(f"shuffle buffer must be an integer >= 1, got {buffer!r}")
    rng = random.Random(seed)
    held: list[T] = []
    for item in items:
        if len(held) < buffer:
            held.append(item)
            continue
        j = rng.randrange(buffer)
        held[j], item = item, held[j]
        yield item
    rng.shuffle(held)
    yield from held
