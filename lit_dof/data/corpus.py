"""Read documents from local corpus files, one at a time (never the whole corpus in memory).

Formats (by content/extension; ``.gz`` is decompressed on the fly):
* WikiExtractor: ``<doc id=… title=…>`` … ``</doc>`` blocks (a WikiExtractor dump);
* JSON lines (``.jsonl``): one object per line, its ``text`` field;
* plain text: documents separated by blank lines.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import zlib
from pathlib import Path
from typing import Iterator

from lit_dof.data.splits import document_split


def is_heldout(index: int, val_every: int) -> bool:
    """The held-out rule: document ``index`` (0-based, in corpus order) is validation iff ``index % val_every == 0``.

    Deterministic, identical on every rank and every run; the training data module, its corpus check and the
    held-out perplexity all split by it.

    Args:
        index: the document's position in the corpus.
        val_every: every ``val_every``-th document is held out (the first included).

    Returns:
        Whether the document is held out.
    """
    return index % val_every == 0


CORPUS_FORMATS = ".txt/.txt.gz/.jsonl/WikiExtractor"
"""The corpus files :func:`iter_documents` reads, as error messages name them."""

SNIFF_BYTES = 64 * 1024
"""How much of a corpus (decompressed) :func:`check_text` reads."""

MAX_BAD_SHARE = 0.1
"""The largest share of control or undecodable characters :func:`check_text` accepts in that sample."""

_BAD_CHARS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")  # control characters but tab/newlines/form feed


def check_corpus_path(path: str | os.PathLike, fix: str = f"pass an existing {CORPUS_FORMATS} file") -> Path:
    """Refuse a corpus path that is a directory or names nothing.

    Args:
        path: the corpus file.
        fix: what the "does not exist" message tells the user to do.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        IsADirectoryError: a directory (the message lists up to three corpus files inside it).
        FileNotFoundError: nothing at ``path``.
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in (".txt", ".gz", ".jsonl"))
        found = f" (it holds {', '.join(inside[:3])}{', …' if len(inside) > 3 else ''})" if inside else ""
        raise IsADirectoryError(
            f"corpus path {path} is a directory, not a corpus file; pass a {CORPUS_FORMATS} file inside it{found}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist; {fix}")
    return path


def check_text(path: str | os.PathLike) -> None:
    """Refuse a corpus file that is not UTF-8 text, by its content: its first :data:`SNIFF_BYTES` (decompressed
    for ``.gz``) may hold at most :data:`MAX_BAD_SHARE` control characters (NUL included; tab, newlines and form
    feed are text) and undecodable bytes. Binary files (random bytes, archives, a gzip file not named ``.gz``,
    UTF-16 text) fail; any UTF-8 text, in any language, passes.

    Args:
        path: the corpus file.

    Raises:
        ValueError: naming the file, what its start holds and the fix.
        gzip.BadGzipFile, EOFError, zlib.error: a ``.gz`` that is not (complete) gzip.
    """
    path = Path(path)
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    if path.suffix != ".gz" and head[:2] == b"\x1f\x8b":
        raise ValueError(f"corpus file {path} is gzip-compressed but not named .gz: rename it to {path.name}.gz")
    text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)  # a cut character: ok
    bad = len(_BAD_CHARS.findall(text))
    if text and bad / len(text) > MAX_BAD_SHARE:
        nul = " (NUL bytes: a binary file, or UTF-16 text?)" if "\x00" in text else ""
        raise ValueError(
            f"corpus file {path} is not UTF-8 text: {bad / len(text):.0%} of the characters in its first {len(head)} "
            f"bytes{' (decompressed)' if path.suffix == '.gz' else ''} are control characters or invalid UTF-8{nul}; "
            f"pass a UTF-8 {CORPUS_FORMATS} file (convert another encoding with iconv -t utf-8)"
        )


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def iter_documents(path: str | os.PathLike) -> Iterator[str]:
    """Yield the documents of a local corpus file, in file order, with surrounding whitespace stripped.

    Raises:
        FileNotFoundError: the file does not exist (names it; set ``LIT_DOF_DATA`` or pass the path).
        IsADirectoryError: ``path`` is a directory.
    """
    path = check_corpus_path(path)
    stem_suffix = Path(path.stem).suffix if path.suffix == ".gz" else path.suffix
    with _open_text(path) as handle:
        if stem_suffix == ".jsonl":
            for line in handle:
                if line.strip():
                    text = json.loads(line).get("text", "").strip()
                    if text:
                        yield text
            return
        first = handle.readline()
        if first.startswith("<doc"):
            yield from _wikiextractor(handle)
            return
        yield from _blank_line_separated(first, handle)


def _wikiextractor(handle) -> Iterator[str]:
    lines: list[str] = []
    for line in handle:
        if line.startswith("</doc>"):
            # The first line repeats the title; drop it so documents are running text.
            text = "".join(lines[1:]).strip()
            if text:
                yield text
            lines = []
        elif not line.startswith("<doc"):
            lines.append(line)


def _blank_line_separated(first: str, handle) -> Iterator[str]:
    lines = [first]
    for line in handle:
        if line.strip():
            lines.append(line)
        elif any(s.strip() for s in lines):
            yield "".join(lines).strip()
            lines = []
    if any(s.strip() for s in lines):
        yield "".join(lines).strip()


def check_corpus(
    path: str | os.PathLike, tokenizer, *, seq_len: int, val_every: int, train_blocks: int, val_blocks: int
) -> dict:
    """Check, before any model loads, that a local corpus can feed a run: readable in the format its name
    says, and holding at least ``train_blocks`` training and ``val_blocks`` held-out blocks of ``seq_len``
    tokens (documents joined by EOS, the held-out ones every ``val_every``-th; the test and long-document splits,
    :mod:`lit_dof.data.splits`, count as neither). Reads only as far as needed.

    Args:
        path: the corpus file.
        tokenizer: the teacher's tokenizer.
        seq_len: tokens per block.
        val_every: the held-out rule (every ``val_every``-th document is held out).
        train_blocks: training blocks needed.
        val_blocks: held-out blocks needed.

    Returns:
        ``{"train_tokens", "val_tokens", "documents"}`` counted until both needs were met.

    Raises:
        FileNotFoundError: no such file. IsADirectoryError: a directory. ValueError: the file is not UTF-8 text
            (:func:`check_text`: binary content), is not in its format (a ``.gz`` that is not gzip, a ``.jsonl`` line
            that is not JSON), has no documents, or too few tokens — the message names the file, what was found and
            what the run needs.
    """
    need = {"train": train_blocks * seq_len, "val": val_blocks * seq_len}
    found = {"train": 0, "val": 0}
    documents = 0
    eos = 1 if tokenizer.eos_token_id is not None else 0
    try:
        check_text(path)
        for i, doc in enumerate(iter_documents(path)):
            documents += 1
            split = {"validation": "val", "train": "train"}.get(document_split(doc, is_heldout(i, val_every)))
            if split is not None and found[split] < need[split]:
                found[split] += len(tokenizer(doc, add_special_tokens=False)["input_ids"]) + eos
            if all(found[s] >= need[s] for s in need):
                break
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ValueError(
            f"corpus file {path} is not a readable gzip file ({exc}); a .gz corpus must be gzip "
            "compressed text: recompress it or drop the .gz suffix"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"corpus file {path}: a line is not JSON ({exc}); a .jsonl corpus needs one JSON "
            'object with a "text" field per line'
        ) from exc
    if documents == 0:
        raise ValueError(
            f"corpus file {path} has no documents; it needs text (WikiExtractor <doc> blocks, .jsonl "
            "lines with a text field, or plain text with blank lines between documents)"
        )
    short = [s for s in need if found[s] < need[s]]
    if short:
        raise ValueError(
            f"corpus file {path} is too short: {documents} documents give {found['train']} training tokens and "
            f"{found['val']} held-out tokens (every {val_every}-th document), but the run needs at least "
            f"{need['train']} training tokens ({train_blocks} blocks of {seq_len}) and {need['val']} held-out tokens "
            f"({val_blocks} validation blocks); use a larger corpus, or lower seq_len, batch_size or val_blocks"
        )
    return {"train_tokens": found["train"], "val_tokens": found["val"], "documents": documents}
