"""Every relative link in README.md, bench/README.md and docs/ leads somewhere.

The documentation is a tree of pages that link to each other; a page moved or a heading
renamed would leave readers at a dead end. Each relative link must name a file inside the
repository, and a ``#fragment`` into a Markdown page must name one of its headings (GitHub's
anchors: lower case, punctuation dropped, spaces as hyphens). Links into ``docs/reference/``
name the generated reference files, which must exist too.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")])
GENERATED_REFERENCES = {"settings.md", "cli.md", "metrics.md", "topics.md"}

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without code: a ``[x](y)`` in a code block or span is not a link."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading anchor of a page (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> list[str]:
    """The page's relative link targets (external and mail links left out)."""
    targets = _LINK.findall(_prose(page.read_text()))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


LINKS = [(page, target) for page in PAGES for target in links(page)]


def test_the_pages_link_to_each_other() -> None:
    assert (ROOT / "docs").is_dir()
    assert len(PAGES) > 10, PAGES
    readme = {target for page, target in LINKS if page.name == "README.md" and page.parent == ROOT}
    for reference in GENERATED_REFERENCES:
        assert f"docs/reference/{reference}" in readme, reference
    assert "docs/performance.md" in readme


@pytest.mark.parametrize(
    ("page", "target"), LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS]
)
def test_each_relative_link_resolves(page: Path, target: str) -> None:
    path_part, _, fragment = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    assert resolved.is_relative_to(ROOT), f"{target} leaves the repository"
    assert resolved.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
    if fragment and resolved.suffix == ".md":
        assert fragment in anchors(resolved), (
            f"{page.relative_to(ROOT)}: no heading #{fragment} in {resolved.relative_to(ROOT)}"
        )


def test_slugs_follow_github() -> None:
    assert slug("What `make test` checks") == "what-make-test-checks"
    assert slug("One host: docker-compose") == "one-host-docker-compose"
    assert slug("Delivery guarantees, and what the tests prove") == (
        "delivery-guarantees-and-what-the-tests-prove"
    )
    assert slug("2026-12-02: Apache Kafka and Tansu side by side") == (
        "2026-12-02-apache-kafka-and-tansu-side-by-side"
    )


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\nSee [x](missing.md), [y](#title), [z](https://example.com), `[c](code.md)`.\n"
        "```\n[d](fenced.md)\n```\n"
    )
    assert links(page) == ["missing.md", "#title"]
    assert anchors(page) == {"title"}


def test_every_page_is_linked_from_another() -> None:
    """A page nobody links to is a page nobody finds."""
    reached = set()
    for page, target in LINKS:
        path_part = target.partition("#")[0]
        if path_part:
            reached.add((page.parent / path_part).resolve())
    orphans = [
        p.relative_to(ROOT).as_posix()
        for p in PAGES
        if p.resolve() not in reached and p != ROOT / "README.md"
    ]
    assert not orphans, orphans
