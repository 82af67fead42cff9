"""Read documents from local corpus files, one at a time (never the whole corpus in memory).

Formats (by content/extension; ``.gz`` is decompressed on the fly):
* WikiExtractor: ``<doc id=… title=…>`` … ``</doc>`` blocks (../shared/data/wikipedia);
* JSON lines (``.jsonl``): one object per line, its ``text`` field;
* plain text: documents separated by blank lines.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import Iterator


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def iter_documents(path: str | os.PathLike) -> Iterator[str]:
    """Yield the documents of a local corpus file, in file order, with surrounding whitespace stripped.

    Raises:
        FileNotFoundError: the file does not exist (names it; set ``LIT_DOF_DATA`` or pass the path).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist; pass an existing .txt/.txt.gz/.jsonl file")
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
