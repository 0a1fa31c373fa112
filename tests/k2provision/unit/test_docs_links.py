"""Every relative link of README.md and docs/*.md leads to a file of the tree, and every
#anchor to a heading of its page (as GitHub names headings)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$")


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for line in prose(page.read_text()):
        match = HEADING.match(line)
        if match:
            name = slug(match.group(1))
            found.add(f"{name}-{seen[name]}" if seen[name] else name)
            seen[name] += 1
    return found


def test_the_slug_is_githubs() -> None:
    assert slug("Fleets: rolling changes") == "fleets-rolling-changes"
    assert slug("status: what runs where, now") == "status-what-runs-where-now"
    assert slug("SGLang `pd` (4P12D: `inventory/prod.ini`)") == "sglang-pd-4p12d-inventoryprodini"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_lead_somewhere(page: Path) -> None:
    broken = []
    for line in prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == []


def test_the_manual_pages_are_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(readme)}
    assert [page.name for page in PAGES[1:] if page.resolve() not in linked] == []
