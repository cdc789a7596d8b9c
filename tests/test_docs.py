"""The README stays a page or two, and the manual under docs/ holds together: every page is in
mkdocs.yml's nav (a page left out is unreachable on the site), every page the nav names exists,
and every relative link of the README and the docs reaches a file (and a heading, for a link
with ``#``). `make docs` (``mkdocs build --strict``) checks the site as built; this runs without
mkdocs installed."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ptconvert import deps

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_LIMIT = 12_000  # bytes (issue 44: "README ≤ 12 KB")

FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*$", re.M)


def nav_pages(nav: list) -> Iterator[str]:
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from nav_pages(value)
        else:
            yield value


def slug(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs names a heading's anchor)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that reach no file, or no heading of it."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


def texts() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_readme_fits_a_screen_or_two() -> None:
    readme = ROOT / "README.md"
    assert len(readme.read_bytes()) <= README_LIMIT, "move the detail into docs/"
    text = readme.read_text()
    # install from source: the index's "ptconvert" is another project
    assert deps.DISTRIBUTION in text and "unrelated" in text
    for target in ("make demo", "make test", "make docs"):
        assert target in text


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config.get("docs_dir", "docs") == "docs"
    listed = list(nav_pages(config["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert sorted(pages - set(listed)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - pages) == [], "nav entries without a page"
    assert len(listed) == len(set(listed)), "a page listed twice"


@pytest.mark.parametrize("page", texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Exit codes\n\ntext\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[ok](other.md) [ok](other.md#exit-codes) [ok](#title) [web](https://x.org)\n"
        "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n"
        "[gone](missing.md) [no heading](other.md#nope) ![img](pic.png)\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nope: no heading #nope in other.md",
        "pic.png: no such file",
    ]
