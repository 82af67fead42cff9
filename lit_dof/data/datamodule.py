"""``WikipediaDataModule``: Wikipedia (or any local corpus) tokenised and packed into fixed-length blocks.

* Source: a local file (``path``, or the ``LIT_DOF_CORPUS`` environment variable; plain text, ``.gz``,
  jsonl or WikiExtractor, see :mod:`lit_dof.data.corpus`), else the hub dataset ``wikimedia/wikipedia``
  streamed with ``datasets`` (``streaming=True``; nothing is downloaded in full). See :mod:`lit_dof.data.sources`.
* Held-out split, deterministic and identical on every rank and every run: in a local file, document *i* (in
  file order) is validation iff ``i % val_every == 0`` (:func:`~lit_dof.data.corpus.is_heldout`); in a hub
  stream, which is split by node and has no global index, a document is validation iff the blake2b hash of its
  ``id`` (else its text) is ``0 mod val_every`` (:func:`~lit_dof.data.sources.is_heldout_by_content`), the same
  documents whatever the rank, worker or shard layout. Validation uses the first ``val_blocks`` packed blocks.
* Test and long-document test splits (:mod:`lit_dof.data.splits`): documents chosen by a hash of their text, the
  same rule for a local file and a hub stream; evaluation scores them (``lit_dof.evaluation``), training skips
  them, this module never yields them.
* Training: the documents of none of those splits, tokenised on the fly with an EOS after each, concatenated and cut
  into blocks of ``seq_len`` tokens; each (rank, dataloader worker) reads its own documents. A local file is dealt
  round robin (rank r, worker w of W takes every (world × W)-th document from r × W + w); a hub stream is split by
  node with ``datasets.distributed.split_dataset_by_node`` (by files when the world size divides the number of
  files, else by example) and by worker (by files where possible, else round robin) — split once, so each node
  reads only its share. Nothing is materialised beyond one block.
* Validation: the ``val_blocks`` held-out blocks (rounded down to a multiple of the world size, so that every
  rank runs as many forwards) are split across ranks (rank r takes blocks r, r + world, …); the perplexities
  are summed as NLL and token counts over ranks, so they are the exact global ones.
* Repeated spans (``repeated_spans``, off by default): in a share of the training blocks a span of the block is
  copied over a later stretch of it, beyond the student's window (:mod:`lit_dof.data.repeated_spans`); the
  validation blocks and the planner's capture blocks (``predict``) are never changed.
* Resume: the training stream skips exactly the batches already consumed (``trainer.global_step ×
  accumulate_grad_batches`` per rank); with dataloader workers, which hand out batches in turn, each worker
  takes over the share of the interrupted run's worker whose batch is due next and skips what that one had
  produced, so a resumed run continues the uninterrupted one's stream batch for batch (exactly, as long as no
  worker's share has run dry).
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lit_dof.data.corpus import check_corpus, check_corpus_path, iter_documents
from lit_dof.data.order import buffer_shuffle
from lit_dof.data.repeated_spans import RepeatedSpans
from lit_dof.data.sources import CORPUS_ENV, HubDocuments, LocalDocuments
from lit_dof.teacher import DEFAULT_TEACHER


class PackedBlocks(IterableDataset):
    """Blocks ``{"input_ids": (seq_len,)}`` packed from a document stream (see the module docstring).

    Args:
        documents: a :class:`~lit_dof.data.sources.LocalDocuments` or
            :class:`~lit_dof.data.sources.HubDocuments` (anything with their ``select``), or a zero-argument
            callable returning a fresh iterator over a local corpus's documents (wrapped in ``LocalDocuments``).
        tokenizer: a transformers tokenizer (its EOS separates documents).
        seq_len: tokens per block. split: ``"train"`` or ``"val"``. val_every: see the module docstring.
        rank, world_size: the DDP shard. skip_batches, batch_size: batches of this rank already consumed
            (resume) and blocks per batch; each dataloader worker skips the batches it produced itself.
        max_blocks: stop after this many blocks (``None``: the whole stream).
        shuffle_seed, shuffle_buffer: training documents read through a seeded shuffle of ``shuffle_buffer``
            documents (lit_dof.data.order.buffer_shuffle; each rank and worker its own generator); ``None``: in
            corpus order.
        repeated_spans: copies spans within training blocks (:class:`~lit_dof.data.repeated_spans.RepeatedSpans`;
            each block's repeats keyed by the shuffle seed, rank, dataloader role and block index); ``None``: none.
    """

    def __init__(
        self,
        documents,
        tokenizer,
        seq_len: int,
        split: str,
        val_every: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        skip_batches: int = 0,
        batch_size: int = 1,
        max_blocks: int | None = None,
        shuffle_seed: int | None = None,
        shuffle_buffer: int = 1024,
        repeated_spans: RepeatedSpans | None = None,
    ) -> None:
        super().__init__()
        self.repeated_spans = repeated_spans if split == "train" else None
        self.documents = documents if hasattr(documents, "select") else LocalDocuments(documents)
        self.tokenizer, self.seq_len = tokenizer, seq_len
        self.split, self.val_every = split, val_every
        self.rank, self.world_size, self.max_blocks = rank, world_size, max_blocks
        self.skip_batches, self.batch_size = skip_batches, batch_size
        self.shuffle_seed, self.shuffle_buffer = shuffle_seed, shuffle_buffer

    def _worker(self) -> tuple[int, int]:
        """``(workers, role)``: a DataLoader takes batch b from worker b % workers, so after ``skip_batches``
        batches the next one is due from worker ``skip_batches % workers`` of the interrupted run — this run's
        worker 0 plays that role, worker 1 the next, and so on."""
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        return workers, (worker_id + self.skip_batches) % workers

    def _skip_blocks(self) -> int:
        """Blocks this worker's role produced before the resume."""
        workers, role = self._worker()
        return len(range(role, self.skip_batches, workers)) * self.batch_size

    def _my_documents(self) -> Iterator[str]:
        if self.split == "val":  # every rank (and worker) validates on the same blocks
            return self.documents.select("validation", self.val_every, rank=0, world=1, role=0, workers=1)
        workers, role = self._worker()
        documents = self.documents.select(
            "train", self.val_every, rank=self.rank, world=self.world_size, role=role, workers=workers
        )
        if self.shuffle_seed is None:
            return documents
        return buffer_shuffle(documents, self.shuffle_buffer, f"{self.shuffle_seed}/rank{self.rank}/role{role}")

    def __iter__(self) -> Iterator[dict]:
        eos = self.tokenizer.eos_token_id
        buffer: list[int] = []
        emitted = 0
        skip = self._skip_blocks()
        blocks = itertools.count()
        key = f"{self.shuffle_seed}/rank{self.rank}/role{self._worker()[1]}/block"  # + the block index: its repeats
        for doc in self._my_documents():
            buffer.extend(self.tokenizer(doc, add_special_tokens=False)["input_ids"])
            if eos is not None:
                buffer.append(eos)
            while len(buffer) >= self.seq_len:
                block, buffer = buffer[: self.seq_len], buffer[self.seq_len :]
                index = next(blocks)
                if index < skip:
                    continue
                ids = torch.tensor(block, dtype=torch.long)
                if self.repeated_spans is not None:
                    ids = self.repeated_spans(ids, f"{key}{index}")
                yield {"input_ids": ids}
                emitted += 1
                if self.max_blocks is not None and emitted >= self.max_blocks:
                    return


class _Blocks(IterableDataset):
    """A fixed list of blocks, iterated in order (no sampler is ever injected into it)."""

    def __init__(self, blocks: list[dict]) -> None:
        super().__init__()
        self.blocks = blocks

    def __iter__(self) -> Iterator[dict]:
        return iter(self.blocks)


class WikipediaDataModule(L.LightningDataModule):
    """Packed Wikipedia blocks for distillation and perplexity (see the module docstring).

    Args:
        tokenizer: the teacher whose tokenizer to use (alias, directory or hub id; linked to
            ``model.teacher`` by the CLI).
        path: local corpus file; ``None``: ``$LIT_DOF_CORPUS`` if set, else the hub dataset.
        hub_dataset: the hub dataset streamed when no local corpus is given.
        hub_config: that dataset's configuration (the Wikipedia dump and language).
        seq_len: tokens per block.
        batch_size: blocks per batch (per device).
        val_every: every ``val_every``-th document of a local file is held out (of a hub stream: about one in
            ``val_every``, by content hash).
        val_blocks: validation blocks (from the held-out documents).
        predict_blocks: training blocks (per rank) that ``predict`` (teacher capture) reads.
        num_workers: dataloader workers (tokenisation runs there).
        shuffle_seed: read the training documents in an order shuffled by this seed (through a buffer of
            ``shuffle_buffer`` documents, lit_dof.data.order), so that independent fits differ in their data order
            as well as their initialisation (``lit-dof compare --seeds`` sets it); ``None`` (default): corpus order.
        shuffle_buffer: documents held by that shuffle.
        repeated_spans: training blocks with a span of their own text repeated beyond the window
            (:class:`~lit_dof.data.repeated_spans.RepeatedSpans`, by ``class_path``); ``None`` (default): plain text.

    Raises:
        ValueError: a size or count below its minimum (``seq_len`` < 2, ``batch_size`` or ``val_every`` < 1, a
            negative ``val_blocks``, ``predict_blocks``, ``num_workers`` or ``shuffle_seed``, ``shuffle_buffer`` < 1),
            or ``seq_len`` too short for ``repeated_spans``' longest repeat, at construction.
        FileNotFoundError: ``path`` does not exist (at ``setup``). IsADirectoryError: ``path`` is a directory.
            ValueError: a local corpus that cannot feed the run — not UTF-8 text (binary content), unreadable in
            its format, empty, or shorter than one batch per rank plus the validation blocks (at ``setup``, before
            the teacher loads; :func:`~lit_dof.data.corpus.check_corpus`).
            CorpusUnavailableError: no local corpus, and hub streaming impossible (at ``setup``: offline mode or the
            hub unreachable; later: anything else that stops the stream).
    """

    def __init__(
        self,
        tokenizer: str = DEFAULT_TEACHER,
        path: str | None = None,
        hub_dataset: str = "wikimedia/wikipedia",
        hub_config: str | None = "20231101.en",
        seq_len: int = 512,
        batch_size: int = 1,
        val_every: int = 100,
        val_blocks: int = 16,
        predict_blocks: int = 8,
        num_workers: int = 0,
        shuffle_seed: int | None = None,
        shuffle_buffer: int = 1024,
        repeated_spans: RepeatedSpans | None = None,
    ) -> None:
        super().__init__()
        for name, value, least in (
            ("seq_len", seq_len, 2),
            ("batch_size", batch_size, 1),
            ("val_every", val_every, 1),
            ("val_blocks", val_blocks, 0),
            ("predict_blocks", predict_blocks, 0),
            ("num_workers", num_workers, 0),
            ("shuffle_buffer", shuffle_buffer, 1),
            ("shuffle_seed", 0 if shuffle_seed is None else shuffle_seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"{name}={value!r} is invalid: it must be an integer >= {least}; set "
                    f"--data.init_args.{name} to such a value"
                )
        if repeated_spans is not None:
            repeated_spans.check_block(seq_len)
        self.save_hyperparameters(ignore=["repeated_spans"])  # an object: recorded as its plain settings
        self.hparams["repeated_spans"] = None if repeated_spans is None else repeated_spans.settings()
        self.tokenizer_name = tokenizer
        self.path = path or os.environ.get(CORPUS_ENV) or None
        self.seq_len, self.batch_size, self.val_every, self.val_blocks = seq_len, batch_size, val_every, val_blocks
        self.num_workers, self.predict_blocks = num_workers, predict_blocks
        self.shuffle = {"shuffle_seed": shuffle_seed, "shuffle_buffer": shuffle_buffer}
        self.hub_dataset, self.hub_config = hub_dataset, hub_config
        self.repeated_spans = repeated_spans
        self.tokenizer = None
        self._checked = False

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and, once, check that a local corpus holds enough blocks for this world size.

        Without a local corpus, first check that the hub stream can load (offline mode, or the hub unreachable),
        so that a run without data fails in seconds, before the teacher loads.

        Raises:
            FileNotFoundError: ``path`` is set but names nothing. IsADirectoryError: it names a directory.
            ValueError: the corpus cannot feed the run (:func:`~lit_dof.data.corpus.check_corpus`).
            CorpusUnavailableError: no local corpus, and the hub stream cannot load
                (:meth:`~lit_dof.data.sources.HubDocuments.check_reachable`).
        """
        if self.path is not None:
            check_corpus_path(self.path, fix=f"fix --data.init_args.path or ${CORPUS_ENV}")
        elif not self._checked:
            HubDocuments(self.hub_dataset, self.hub_config).check_reachable()
            self._checked = True
        if self.tokenizer is None:
            from lit_dof.teacher.loading import load_tokenizer

            self.tokenizer = load_tokenizer(self.tokenizer_name)
        if self.path is not None and not self._checked:  # before the teacher loads (configure_model comes later)
            _, world = self._rank()
            check_corpus(
                self.path,
                self.tokenizer,
                seq_len=self.seq_len,
                val_every=self.val_every,
                train_blocks=self.batch_size * world,
                val_blocks=self.val_blocks,
            )
            self._checked = True

    @property
    def documents(self) -> LocalDocuments | HubDocuments:
        """The document source: the local file, else the hub stream (:mod:`lit_dof.data.sources`)."""
        if self.path is not None:
            return LocalDocuments(functools.partial(iter_documents, self.path))
        return HubDocuments(self.hub_dataset, self.hub_config)

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _consumed_batches(self) -> int:
        trainer = self.trainer
        if trainer is None:
            return 0
        return trainer.global_step * trainer.accumulate_grad_batches

    def train_dataloader(self) -> DataLoader:
        """Packed ``seq_len``-token training blocks, this rank's share, skipping batches already consumed on resume."""
        return self._train_loader(self._consumed_batches())

    def train_batch(self, index: int) -> dict:
        """The training batch :meth:`train_dataloader` yields at data index ``index`` on this rank (batches since
        step 0; the same workers' layout), read again: what a resumed run needs to re-create a teacher capture
        the interrupted run kept (lit_dof.pipeline.teacher_reuse).

        Args:
            index: the batch's data index (≥ 0).

        Returns:
            ``{"input_ids": (batch_size, seq_len)}``.
        """
        return next(iter(self._train_loader(index)))

    def _train_loader(self, skip_batches: int) -> DataLoader:
        data = self._train_blocks(
            skip_batches=skip_batches, batch_size=self.batch_size, repeated_spans=self.repeated_spans
        )
        return DataLoader(data, batch_size=self.batch_size, num_workers=self.num_workers)

    def _train_blocks(self, **limits) -> PackedBlocks:
        """This rank's training blocks in the shuffled order; ``limits``: ``skip_batches`` + ``batch_size`` (a
        resumed stream) or ``max_blocks``, and ``repeated_spans`` (training only, not the planner's capture)."""
        rank, world = self._rank()
        return PackedBlocks(
            self.documents,
            self.tokenizer,
            self.seq_len,
            "train",
            self.val_every,
            rank=rank,
            world_size=world,
            **limits,
            **self.shuffle,
        )

    def val_dataloader(self) -> DataLoader:
        """The first ``val_blocks`` held-out blocks, cut to a multiple of the world size, this rank's equal share.

        Raises:
            ValueError: fewer validation blocks than ranks.
        """
        rank, world = self._rank()
        if self.val_blocks < world:
            raise ValueError(
                f"val_blocks={self.val_blocks} is fewer than the {world} ranks: every rank needs a "
                "validation block; raise --data.init_args.val_blocks"
            )
        data = PackedBlocks(
            self.documents, self.tokenizer, self.seq_len, "val", self.val_every, max_blocks=self.val_blocks
        )
        blocks = list(data)
        blocks = blocks[: len(blocks) // world * world]  # equal shares: a sharded forward is a collective
        # This rank's share, as an iterable: Lightning would otherwise re-split a list with a DistributedSampler
        # that pads uneven shares with repeated blocks.
        return DataLoader(_Blocks(blocks[rank::world]), batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        """Up to ``predict_blocks`` training blocks, this rank's share: the samples of the DoF capture."""
        data = self._train_blocks(max_blocks=self.predict_blocks)
        return DataLoader(data, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        """The validation blocks (:meth:`val_dataloader`)."""
        return self.val_dataloader()
