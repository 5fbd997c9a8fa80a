"""The docs a reader finds: every page reachable from the README by its links, no page
over 800 lines, and every relative link naming a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONGEST = 800
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(page: Path) -> list[Path]:
    """The local Markdown files a page links to (web addresses and anchors aside)."""
    out = []
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        out.append((page.parent / target).resolve())
    return out


def test_every_relative_link_names_a_file_that_exists() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        missing = [str(target) for target in _links(page) if not target.exists()]
        assert missing == [], f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_every_page_is_reachable_from_the_readme() -> None:
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo += _links(page)
    pages = set((ROOT / "docs").rglob("*.md"))
    assert sorted(str(p.relative_to(ROOT)) for p in pages - seen) == []


def test_no_page_is_over_800_lines() -> None:
    long = {str(page.relative_to(ROOT)): n for page in (ROOT / "docs").rglob("*.md")
            if (n := page.read_text().count("\n")) > LONGEST}
    assert long == {}
