"""Data: the training and evaluation text, streamed one document at a time.

* :mod:`~lit_dof.data.corpus` — local corpus files (plain text, .gz, jsonl, WikiExtractor) read document by document;
* :mod:`~lit_dof.data.splits` — which split a document belongs to (train, validation, test, long-document test);
* :mod:`~lit_dof.data.sources` — which documents one (rank, dataloader worker) reads: a local file or the hub;
* :mod:`~lit_dof.data.order` — the order a training stream reads them in (file order or a seeded shuffle);
* :mod:`~lit_dof.data.repeated_spans` — training blocks that repeat a span of their own text beyond the window;
* :mod:`~lit_dof.data.datamodule` — ``WikipediaDataModule``: documents tokenised and packed into fixed-length blocks.
"""
