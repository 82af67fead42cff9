"""What the far-term rule scripts beside this file (copy_rule.py, long_rule.py) read alike: a compare cell's record
or its committed copy here, the choosing passkey record checked against the designs' grid, hits per context, and two
rows paired item by item."""

import json
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent


def load(cell: Path, committed: str):
    """A cell's record, else the committed copy beside this script, else None."""
    for path in (cell, HERE / committed):
        if path.exists():
            return json.loads(path.read_text())
    return None


def passkey(cells: Path, row: str, committed: str | None = None):
    """A row's choosing passkey record (retrieval seed 1, 2k and 4k, 3 trials: the designs' grid) from ``cells``
    (a compare run's ``C64`` folder, or its ``seed<s>`` folder), else its committed copy (``committed``, default
    ``<row>_choose_passkey.json``), else None."""
    record = load(cells / row / "retrieval" / "passkey.json", committed or f"{row}_choose_passkey.json")
    if record:
        grid = record["provenance"]["retrieval"]
        assert grid["seed"] == 1 and grid["contexts"] == [2048, 4096] and grid["trials"] == 3, grid
    return record


def hits(record: dict, context: int) -> tuple[int, int]:
    """(hits, prompts) at one context over every depth."""
    cells = record["cells"][str(context)].values()
    return round(sum(c["mean"] * c["n"] for c in cells)), sum(c["n"] for c in cells)


def misses(record: dict) -> bool:
    """A choosing passkey record under the choosing rule's bar: fewer than 8 of 15 prompts at 2k or at 4k."""
    return any(hits(record, context)[0] < 8 for context in (2048, 4096))


def gained_lost(record: dict, other: dict) -> tuple[int, int]:
    """Items ``record`` gets right and ``other`` wrong, and the reverse (the same prompts, paired)."""
    a, b = record["items"]["exact_match"], other["items"]["exact_match"]
    assert len(a) == len(b), "not the same items"
    return sum(x > y for x, y in zip(a, b)), sum(x < y for x, y in zip(a, b))


def answer_openings(record: dict, count: int = 3) -> str:
    """A passkey record's commonest answer openings (40 characters), ``n× 'text'…`` joined by ``; ``."""
    openings = Counter(example["generation"][:40] for example in record["examples"]).most_common(count)
    return "; ".join(f"{n}× {text!r}…" for text, n in openings)
