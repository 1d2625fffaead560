"""The README stays a page, and the manual (docs/, mkdocs.yml) builds in strict mode: no broken link or anchor,
no page left out of the navigation. Its examples run in tests/runs/test_readme.py and
tests/integration/test_readme_slurm.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO
from ..readme_examples import code_blocks

README = REPO / "README.md"
PAGE_LINES = 60


def test_the_readme_fits_on_a_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= PAGE_LINES, f"README.md has {len(lines)} lines; the rest belongs in the manual (docs/)"


def test_every_link_of_the_readme_names_a_file_and_its_anchor() -> None:
    """GitHub shows the README outside the site, so mkdocs does not check its links: this does."""
    text = README.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert len(links) >= 10, links
    for target, anchor in links:
        path = REPO / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in heading_ids(path.read_text()), f"README.md links to {target}#{anchor}: no such heading"


def test_every_page_of_the_manual_is_in_the_readme_map() -> None:
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README.read_text()))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md", "design-nested-slurm-keys.md"}
    assert pages <= linked, f"pages the README's map does not name: {sorted(pages - linked)}"


def test_the_manual_builds_in_strict_mode(tmp_path: Path) -> None:
    """mkdocs (the `dev` extra) with the config's strict mode and link/anchor/nav validation set to warn."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    for page in (REPO / "docs").glob("*.md"):
        built = tmp_path / "site" / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), f"{page.name} was not built"
    # Every code block of a page reaches the site (a stray fence would swallow the rest of a page).
    slurm = (REPO / "docs" / "slurm.md").read_text()
    html = (tmp_path / "site" / "slurm" / "index.html").read_text()
    assert html.count("<pre") >= len(code_blocks(slurm)) > 0


def heading_ids(markdown: str) -> set[str]:
    """The anchors mkdocs's toc (and GitHub) give a page's headings, outside code blocks."""
    ids, in_code = set(), False
    for line in markdown.splitlines():
        in_code ^= line.startswith("```")
        if not in_code and (m := re.match(r"#+ (.*)", line)):
            ids.add(re.sub(r"[^\w\- ]", "", m[1].lower()).strip().replace(" ", "-"))
    return ids
