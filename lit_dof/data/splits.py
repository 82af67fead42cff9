"""Which split a corpus document belongs to: training, validation, test or the long-document test set.

Four disjoint splits, decided document by document in this order of precedence:

1. **validation** — unchanged since the committed results, and the only split that depends on the source: in a
   local file document *i* (0-based, file order) iff ``i % val_every == 0``
   (:func:`~lit_dof.data.corpus.is_heldout`); in a hub stream iff ``blake2b(id, else text) % val_every == 0``
   (:func:`~lit_dof.data.sources.is_heldout_by_content`). Model selection (the fit's validation blocks, the
   variants chosen so far) uses it.
2. **long** (the long-document test set) — a document that is not validation, has at least
   :data:`LONG_DOCUMENT_CHARS` characters (Unicode code points of the stripped text, so no tokenizer is needed)
   and whose personalised hash ``blake2b(text, person=b"lit-dof long") % LONG_EVERY == 0``: half of the long
   documents. Half, not all: the set stays large enough for a standard error over documents, while the other half
   stays in training — the long articles are the only text of the corpus with real dependencies past a few
   thousand tokens, which a student trained on long blocks needs. The character threshold is chosen so that
   nearly every such document reaches 4096 tokens of a ~4-characters-per-token tokenizer (the sizes measured on
   the local corpus, and why not 16,000: docs/results/splits/README.md).
3. **test** — a document that is neither, whose personalised hash
   ``blake2b(text, person=b"lit-dof test") % TEST_EVERY == 0``: about one document in 100, as many as
   validation at its default ``val_every`` of 100, and untouched by any decision taken on validation.
4. **train** — every other document.

The test and long rules read only the document's text (its stripped text, as both sources yield it), so a local
file and a hub stream holding the same documents put the same documents there, whatever the rank, worker or
shard layout; they differ only by the documents each source's validation rule takes first (about 1 in 100 of
the candidates). A personalised blake2b is a different hash from validation's, not a residue of the same one.

The sizes of each split on the local corpus (documents, tokens): docs/results/splits/README.md.
"""

from __future__ import annotations

import hashlib

SPLITS = ("train", "validation", "test", "long")
"""The split names, as :func:`document_split` returns them and the sources' ``select`` takes them."""

TEST_EVERY = 100
"""About one document in ``TEST_EVERY`` is a test document (the ones not already validation or long)."""

LONG_DOCUMENT_CHARS = 20_000
"""The fewest characters of a long document."""

LONG_EVERY = 2
"""About one long document in ``LONG_EVERY`` is in the long-document test set; the rest are trained on."""

_TEST_PERSON = b"lit-dof test"
_LONG_PERSON = b"lit-dof long"


def _residue(text: str, person: bytes, modulus: int) -> int:
    """``blake2b(text, digest_size=8, person=person)`` as a big-endian integer, modulo ``modulus``: stable across
    runs, machines and processes (no ``hash()`` salt)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=person).digest()
    return int.from_bytes(digest, "big") % modulus


def is_long_document(text: str) -> bool:
    """Whether a (non-validation) document is in the long-document test set (rule 2 of the module docstring).

    Args:
        text: the document's stripped text.

    Returns:
        ``len(text) >= LONG_DOCUMENT_CHARS`` and its long hash is ``0 mod LONG_EVERY``.
    """
    return len(text) >= LONG_DOCUMENT_CHARS and _residue(text, _LONG_PERSON, LONG_EVERY) == 0


def is_test_document(text: str) -> bool:
    """Whether a document that is neither validation nor long is a test document (rule 3).

    Args:
        text: the document's stripped text.

    Returns:
        Its test hash is ``0 mod TEST_EVERY``.
    """
    return _residue(text, _TEST_PERSON, TEST_EVERY) == 0


def check_split(split: str) -> str:
    """Refuse an unknown split name.

    Args:
        split: a split name.

    Returns:
        ``split``.

    Raises:
        ValueError: not one of :data:`SPLITS` (the message lists them).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    return split


def document_split(text: str, validation: bool) -> str:
    """The split of one document (the module docstring's rules, in their order of precedence).

    Args:
        text: the document's stripped text.
        validation: whether the source's validation rule holds it out (by index in a local file, by hash of its
            id in a hub stream).

    Returns:
        ``"validation"``, ``"long"``, ``"test"`` or ``"train"``.
    """
    if validation:
        return "validation"
    if is_long_document(text):
        return "long"
    return "test" if is_test_document(text) else "train"


def split_rule(split: str, val_every: int = 100) -> str:
    """The rule of ``split`` in words, for the records a measurement writes.

    Args:
        split: a split name (:data:`SPLITS`).
        val_every: the validation modulus.

    Returns:
        One sentence.

    Raises:
        ValueError: an unknown split.
    """
    validation = (
        f"local file: document index i % {val_every} == 0; hub stream: blake2b(id, else text) % {val_every} == 0"
    )
    rules = {
        "validation": validation,
        "long": f"not validation ({validation}), at least {LONG_DOCUMENT_CHARS} characters, and "
        f"blake2b(text, digest_size=8, person={_LONG_PERSON!r}) % {LONG_EVERY} == 0",
        "test": f"not validation ({validation}), not long, and "
        f"blake2b(text, digest_size=8, person={_TEST_PERSON!r}) % {TEST_EVERY} == 0",
        "train": "neither validation, long nor test",
    }
    return rules[check_split(split)]


def recorded_split(record: dict) -> str:
    """The split a perplexity record measured: its ``split``, else ``"validation"`` (the records written before the
    test split existed measured the validation documents).

    Args:
        record: a perplexity record (``ppl.json``, ``long.json``, a ``scripts/heldout_ppl.py`` output).
    """
    return record.get("split") or "validation"


def check_record_split(record: dict, split: str, where) -> dict:
    """Refuse a record of another split than the one asked for (a comparison cell measured before the test split).

    Args:
        record: a perplexity record.
        split: the split asked for.
        where: the record's file, named in the message.

    Returns:
        ``record``.

    Raises:
        ValueError: it measured another split; the message names both and the fixes.
    """
    found = recorded_split(record)
    if found != split:
        raise ValueError(
            f"{where} measured the {found} split, not the {split} split: pass --ppl_split {found} to use it, or move "
            f"it aside to measure the {split} split"
        )
    return record
