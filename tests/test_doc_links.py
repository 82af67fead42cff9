"""Every relative link in README.md, docs/**/*.md and tools/README.md names a file or folder of the checkout,
and every ``#anchor`` into a markdown file names one of its headings (GitHub's slugs). No model, no network: well
under a second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "tools" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """Link targets outside code blocks and code spans."""
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    broken = []
    for target in links(document.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{document.relative_to(ROOT)}: broken links {broken}"


def test_committed_records_name_no_path_of_the_machine_that_made_them():
    """Records and reports under docs/ name runs and data relative to the checkout (``runs/…``, ``../shared/…``),
    never the absolute folders of one machine."""
    machine = re.compile(r"(?<![\w.])/(?:work|root|home|tmp)/[\w.-]+/")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "docs").rglob("*"))
        if path.suffix in (".md", ".json", ".txt", ".sh")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if machine.search(line)
    ]
    assert not found, f"machine-specific paths committed: {found[:10]}"
