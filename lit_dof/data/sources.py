"""Document sources: which documents one (rank, dataloader worker) reads, and which are held out.

Two sources, each with its own held-out rule:

* :class:`LocalDocuments` (a local corpus file, :mod:`lit_dof.data.corpus`): document *i* in file order is held
  out iff ``i % val_every == 0`` (:func:`~lit_dof.data.corpus.is_heldout`); the training documents are dealt
  round robin over rank × worker. Unchanged since the committed results, which depend on this held-out set.
* :class:`HubDocuments` (a ``datasets`` streaming dataset, e.g. ``wikimedia/wikipedia``): a stream split by
  node has no global document index, so a document is held out by its content —
  :func:`is_heldout_by_content` of its ``id`` field when the dataset has one, else of its text — and the same
  documents are held out whatever the rank count, worker count or shard split. Each node reads only its share
  of the stream (``datasets.distributed.split_dataset_by_node``), each worker only its share of that
  (:func:`split_hub_stream`).
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Callable, Iterator

from lit_dof.data.corpus import is_heldout

CORPUS_ENV = "LIT_DOF_CORPUS"


def is_heldout_by_content(key: str, val_every: int) -> bool:
    """The held-out rule of streamed datasets: a document is validation iff ``blake2b(key) mod val_every == 0``.

    Stable across runs, machines and Python processes (no ``hash()`` salt), and independent of where the document
    sits in the stream, so every layout of ranks, workers and shards holds out the same documents (about one in
    ``val_every``).

    Args:
        key: the document's ``id`` field when the dataset has one, else its (stripped) text.
        val_every: about one document in ``val_every`` is held out (all of them when 1).

    Returns:
        Whether the document is held out.
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % val_every == 0


class LocalDocuments:
    """The documents of a local corpus: held out by position, training ones dealt round robin over rank × worker.

    Args:
        documents: a zero-argument callable returning a fresh iterator over the corpus documents, in order.
    """

    def __init__(self, documents: Callable[[], Iterator[str]]) -> None:
        self.documents = documents

    def select(self, heldout: bool, val_every: int, *, rank: int, world: int, role: int, workers: int) -> Iterator[str]:
        """This (rank, worker)'s documents of one split.

        Args:
            heldout: the held-out documents (``True``) or the training ones.
            val_every: document *i* is held out iff ``i % val_every == 0``.
            rank: the node's rank.
            world: the world size (ranks).
            role: the worker's share, in ``[0, workers)``.
            workers: the number of dataloader workers (1 without workers).

        Returns:
            An iterator over the split's ``k``-th documents with ``k % (world × workers) == rank × workers + role``.
        """
        shards, shard = world * workers, rank * workers + role
        kept = (doc for i, doc in enumerate(self.documents()) if is_heldout(i, val_every) == heldout)
        return itertools.islice(kept, shard, None, shards)


def split_hub_stream(stream, rank: int, world: int, role: int, workers: int):
    """This (rank, worker)'s share of a streaming dataset, split once by node and once by worker.

    The node split is ``datasets.distributed.split_dataset_by_node`` with its ``auto`` rule made once on the
    whole dataset: by files when the world size divides the number of shards (files), else every ``world``-th
    example. The worker split is by files where it can be (``stream.shard(workers, role, contiguous=False)``,
    taken before the node split: after an example-level node split this is exactly datasets' own DataLoader
    worker split; after a file-level one it needs ``world × workers`` to divide the shard count so that every
    worker still has files for every node), else the caller deals the node's documents round robin.

    Iterate the result with ``IterableDataset.iter`` (not ``for row in ds``): inside a DataLoader worker the
    latter splits by worker a second time.

    Args:
        stream: a ``datasets.IterableDataset`` (not yet split).
        rank: the node's rank.
        world: the world size (ranks).
        role: the worker's share, in ``[0, workers)``.
        workers: the number of dataloader workers (1 without workers).

    Returns:
        ``(dataset, by_files)``: the split dataset, and whether the worker split is already in it (``False``:
        the caller keeps every ``workers``-th document from ``role``).
    """
    from datasets.distributed import split_dataset_by_node

    shards = stream.num_shards
    node_by_files = shards % world == 0
    by_files = workers > 1 and (shards % (world * workers) == 0 if node_by_files else shards >= workers)
    if by_files:
        stream = stream.shard(num_shards=workers, index=role, contiguous=False)
    strategy = "shards" if node_by_files else "examples"
    return split_dataset_by_node(stream, rank=rank, world_size=world, strategy=strategy), by_files


class HubDocuments:
    """The documents of a streamed hub dataset (``datasets``, ``streaming=True``): held out by content, each
    node and worker reading only its share (see the module docstring).

    Args:
        dataset: the hub dataset (e.g. ``wikimedia/wikipedia``).
        config: its configuration (e.g. ``20231101.en``).
        split: the dataset split to stream.
    """

    def __init__(self, dataset: str, config: str | None, split: str = "train") -> None:
        self.dataset, self.config, self.split = dataset, config, split

    def load(self):
        """The whole stream, unsplit.

        Raises:
            RuntimeError: the dataset cannot be streamed (offline, unknown name, …); says how to use a local file.
        """
        try:
            from datasets import load_dataset

            return load_dataset(self.dataset, self.config, split=self.split, streaming=True)
        except Exception as exc:  # offline, unknown dataset, …: say how to use a local corpus instead
            raise RuntimeError(
                f"cannot stream {self.dataset} ({self.config}) from the Hugging Face hub: {exc}. Offline, point at "
                f"a local corpus with --data.path FILE or the {CORPUS_ENV} environment variable"
            ) from exc

    def select(self, heldout: bool, val_every: int, *, rank: int, world: int, role: int, workers: int) -> Iterator[str]:
        """This (rank, worker)'s documents of one split: its share of the stream, held out by
        :func:`is_heldout_by_content`; empty texts are skipped.

        Args:
            heldout: the held-out documents (``True``) or the training ones.
            val_every: the held-out rule's modulus.
            rank: the node's rank.
            world: the world size (ranks).
            role: the worker's share, in ``[0, workers)``.
            workers: the number of dataloader workers (1 without workers).

        Returns:
            An iterator over the stripped texts, in stream order.
        """
        stream, by_files = split_hub_stream(self.load(), rank, world, role, workers)
        docs = self._documents(stream, heldout, val_every)
        return docs if by_files or workers == 1 else itertools.islice(docs, role, None, workers)

    @staticmethod
    def _documents(stream, heldout: bool, val_every: int) -> Iterator[str]:
        for batch in stream.iter(batch_size=64):
            ids = batch.get("id") or [None] * len(batch.get("text", []))
            for key, text in zip(ids, batch.get("text", [])):
                text = text.strip() if text else ""
                if text and is_heldout_by_content(text if key is None else str(key), val_every) == heldout:
                    yield text
