"""The README's and docs' relative links lead somewhere: each linked file exists and each `#anchor` is a heading of
its file (GitHub's heading ids), so that moving or renaming a section cannot silently leave readers at a dead end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_ids(page: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    headings = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return [link for link in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


def test_heading_ids_follow_github() -> None:
    page = ROOT / "docs" / "performance.md"
    assert {"issue-17s-goals-one-command", "torchcompile", "what-is-left-and-what-would-close-it"} <= heading_ids(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_lead_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no file {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
        elif anchor and target.suffix == ".md" and anchor not in heading_ids(target):
            broken.append(f"{link}: no heading '#{anchor}' in {target.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)
