"""Document sources: which documents one (rank, dataloader worker) reads, and which split each is in.

Two sources, each with its own validation rule (the test and long-document splits read only the text, the same
rule for both: :mod:`lit_dof.data.splits`):

* :class:`LocalDocuments` (a local corpus file, :mod:`lit_dof.data.corpus`): document *i* in file order is
  validation iff ``i % val_every == 0`` (:func:`~lit_dof.data.corpus.is_heldout`); the training documents are
  dealt round robin over rank × worker. Unchanged since the committed results, which depend on this held-out set
  (their training streams still held the test and long documents, which training now skips).
* :class:`HubDocuments` (a ``datasets`` streaming dataset, e.g. ``wikimedia/wikipedia``): a stream split by
  node has no global document index, so a document is held out by its content —
  :func:`is_heldout_by_content` of its ``id`` field when the dataset has one, else of its text — and the same
  documents are held out whatever the rank count, worker count or shard split. Each node reads only its share
  of the stream (``datasets.distributed.split_dataset_by_node``), each worker only its share of that
  (:func:`split_hub_stream`).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
from typing import Callable, Iterator

from lit_dof.data.corpus import is_heldout
from lit_dof.data.splits import LONG_DOCUMENT_CHARS, check_split, document_split
from lit_dof.errors import CommandError
from lit_dof.extras import require

CORPUS_ENV = "LIT_DOF_CORPUS"

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
"""The environment variables that put ``huggingface_hub`` / ``datasets`` in offline mode."""


class CorpusUnavailableError(CommandError, RuntimeError):
    """No local corpus is set and the hub dataset cannot be streamed (offline mode, no network, …)."""


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` turns offline mode on (``1``/``ON``/``YES``/``TRUE``),
    read now: ``huggingface_hub`` reads it once, at import."""
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_ENV)


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
    """The documents of a local corpus: validation by position, each split's documents dealt round robin over
    rank × worker.

    Args:
        documents: a zero-argument callable returning a fresh iterator over the corpus documents, in order.
    """

    def __init__(self, documents: Callable[[], Iterator[str]]) -> None:
        self.documents = documents

    def select(self, split: str, val_every: int, *, rank: int, world: int, role: int, workers: int) -> Iterator[str]:
        """This (rank, worker)'s documents of one split.

        Args:
            split: ``"train"``, ``"validation"``, ``"test"`` or ``"long"``
                (:func:`~lit_dof.data.splits.document_split`).
            val_every: document *i* is validation iff ``i % val_every == 0``.
            rank: the node's rank.
            world: the world size (ranks).
            role: the worker's share, in ``[0, workers)``.
            workers: the number of dataloader workers (1 without workers).

        Returns:
            An iterator over the split's ``k``-th documents with ``k % (world × workers) == rank × workers + role``.

        Raises:
            ValueError: an unknown split.
        """
        check_split(split)
        shards, shard = world * workers, rank * workers + role
        kept = (doc for i, doc in enumerate(self.documents()) if document_split(doc, is_heldout(i, val_every)) == split)
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
    """The documents of a streamed hub dataset (``datasets``, ``streaming=True``): split by content, each
    node and worker reading only its share (see the module docstring).

    Args:
        dataset: the hub dataset (e.g. ``wikimedia/wikipedia``).
        config: its configuration (e.g. ``20231101.en``).
        split: the dataset split to stream.
    """

    def __init__(self, dataset: str, config: str | None, split: str = "train") -> None:
        self.dataset, self.config, self.split = dataset, config, split

    def unavailable(self, reason: str) -> str:
        """The one-line message of a stream that cannot load: why, and how to train from a local file instead."""
        return (
            f"no corpus: --data.init_args.path and ${CORPUS_ENV} are unset, and {self.dataset} ({self.config}) "
            f"cannot be streamed from the Hugging Face hub: {reason}. Point --data.init_args.path (or "
            f"{CORPUS_ENV}) at a local corpus file (plain text, .gz, .jsonl or WikiExtractor output; docs/usage.md), "
            "or run where the hub is reachable"
        )

    def check_reachable(self, timeout: float = 5.0) -> None:
        """Fail at once when the stream cannot load, instead of at its first read (after the teacher has loaded,
        and after ``datasets``'s own retries): offline mode (:func:`hub_offline`), or one request to
        the hub's dataset API that gets no answer within ``timeout`` seconds. An answer of any status passes
        (a gated or unknown dataset is for ``datasets`` to report).

        Args:
            timeout: seconds to wait for the hub.

        Raises:
            CorpusUnavailableError: offline, or the hub unreachable (no network, DNS, proxy, timeout).
        """
        if hub_offline():
            raise CorpusUnavailableError(self.unavailable("offline mode is on (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)"))
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        try:
            HfApi().dataset_info(self.dataset, timeout=timeout)
        except HfHubHTTPError:  # the hub answered
            return
        except Exception as exc:  # no answer: connection, name resolution, proxy, timeout, offline mode
            reason = f"the hub is unreachable ({type(exc).__name__}: {exc})"
            raise CorpusUnavailableError(self.unavailable(reason)) from exc

    def load(self):
        """The whole stream, unsplit.

        Raises:
            CorpusUnavailableError: the dataset cannot be streamed (offline, unknown name, …); says how to use a
                local file. MissingExtraError: the datasets package is not installed (the ``train`` extra).
        """
        require("datasets", f"streaming the hub corpus {self.dataset}")
        try:
            from datasets import load_dataset

            return load_dataset(self.dataset, self.config, split=self.split, streaming=True)
        except Exception as exc:  # offline, unknown dataset, …: say how to use a local corpus instead
            raise CorpusUnavailableError(self.unavailable(str(exc))) from exc

    def select(self, split: str, val_every: int, *, rank: int, world: int, role: int, workers: int) -> Iterator[str]:
        """This (rank, worker)'s documents of one split: its share of the stream, validation by
        :func:`is_heldout_by_content`, the other splits by :func:`~lit_dof.data.splits.document_split`; empty texts
        are skipped.

        Args:
            split: ``"train"``, ``"validation"``, ``"test"`` or ``"long"``.
            val_every: the validation rule's modulus.
            rank: the node's rank.
            world: the world size (ranks).
            role: the worker's share, in ``[0, workers)``.
            workers: the number of dataloader workers (1 without workers).

        Returns:
            An iterator over the stripped texts, in stream order.

        Raises:
            ValueError: an unknown split. CorpusUnavailableError: the stream cannot load (:meth:`load`).
        """
        check_split(split)
        stream, by_files = split_hub_stream(self.load(), rank, world, role, workers)
        docs = self._documents(stream, split, val_every)
        return docs if by_files or workers == 1 else itertools.islice(docs, role, None, workers)

    @staticmethod
    def _documents(stream, split: str, val_every: int) -> Iterator[str]:
        for batch in stream.iter(batch_size=64):
            ids = batch.get("id") or [None] * len(batch.get("text", []))
            for key, text in zip(ids, batch.get("text", [])):
                text = text.strip() if text else ""
                validation = bool(text) and is_heldout_by_content(text if key is None else str(key), val_every)
                if text and document_split(text, validation) == split:
                    yield text

    def __str__(self) -> str:
        return f"hub:{self.dataset}" + (f"/{self.config}" if self.config else "")


def split_documents(source, split: str, val_every: int = 100) -> Iterator[str]:
    """Every document of one split of a corpus, in corpus order (one reader: rank 0 of 1, no workers).

    Args:
        source: a local corpus file (``.txt``/``.gz``/``.jsonl``/WikiExtractor), or a
            :class:`LocalDocuments` / :class:`HubDocuments`.
        split: ``"train"``, ``"validation"``, ``"test"`` or ``"long"`` (:mod:`lit_dof.data.splits`).
        val_every: the validation modulus (the data module's ``val_every``).

    Returns:
        An iterator over the split's stripped texts.

    Raises:
        ValueError: an unknown split. FileNotFoundError: no file at ``source`` (when iterated).
    """
    if isinstance(source, (str, os.PathLike)):
        import functools

        from lit_dof.data.corpus import iter_documents

        source = LocalDocuments(functools.partial(iter_documents, source))
    return source.select(split, val_every, rank=0, world=1, role=0, workers=1)


def last_long_documents(
    source, tokenizer, count: int, *, min_tokens: int, split: str = "train"
) -> tuple[list[str], list[int], int]:
    """The last ``count`` documents of one split with at least ``LONG_DOCUMENT_CHARS`` characters and ``min_tokens``
    tokens: long articles that a fit, streaming the training split from its start, never reaches (a long-document
    choosing set outside the test split; docs/results/far_term).

    Args:
        source: as for :func:`split_documents`.
        tokenizer: a Hugging Face tokenizer (the tokens are counted without special tokens).
        count: how many documents.
        min_tokens: the fewest tokens a document must have.
        split: the split they come from.

    Returns:
        ``(texts, indices, total)``: the documents in corpus order, their indices within the split, and the split's
        size in documents (the whole split is read).
    """
    last: collections.deque = collections.deque(maxlen=count)
    total = 0
    for index, text in enumerate(split_documents(source, split)):
        total = index + 1
        if len(text) < LONG_DOCUMENT_CHARS:
            continue
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= min_tokens:
            last.append((index, text))
    return [t for _, t in last], [i for i, _ in last], total
