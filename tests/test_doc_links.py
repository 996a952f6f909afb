"""Every relative link of README.md and of every markdown page under docs/ (the user guide, docs/internals/,
docs/datasets/) resolves: the file or folder exists, and a ``#fragment`` into a markdown page names one of its
headings (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The link targets of a markdown text, outside code blocks and code spans."""
    return LINK.findall(INLINE_CODE.sub("", FENCE.sub("", text)))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``;
    a repeated heading gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text(encoding="utf-8")), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_links_finds_links_outside_code_only():
    text = "[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n[d](w.md#h) [e](https://example.com)"
    assert links(text) == ["x.md", "w.md#h", "https://example.com"]


def test_anchors_follow_github(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Compare two systems: `recallk compare`\n## A\n## A\n```\n# not a heading\n```\n")
    assert anchors(page) == {"compare-two-systems-recallk-compare", "a", "a-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
