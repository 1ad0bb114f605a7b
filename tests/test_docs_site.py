"""The documentation site (issue 27): `mkdocs build --strict` from docs/, offline, fails on a link to a page or an
anchor that does not exist; every page in docs/ is in the site's navigation, and the pages link to each other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strict_with_every_page(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {page for item in nav for page in item.values()}
    assert pages == {p.name for p in (ROOT / "docs").glob("*.md")}  # a new page must be in the nav
    for page in pages:
        built = tmp_path / "site" / ("index.html" if page == "index.md" else Path(Path(page).stem) / "index.html")
        assert built.is_file(), page
    home = (tmp_path / "site" / "index.html").read_text()
    assert all(f'href="{Path(p).stem}/"' in home for p in pages if p != "index.md")  # the home links every page


def test_a_broken_link_fails_the_build(tmp_path):
    """The check can fail: a copy of the docs with one link to a missing page does not build."""
    import shutil

    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text()) | {"docs_dir": str(docs)}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no-such-page.md" in proc.stderr
