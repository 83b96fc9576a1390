"""The docs site builds strictly (mkdocs.yml): a link to a missing page or a page left out of the
navigation fails the build, naming the page. `make lint` builds the real site the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_a_broken_link_and_a_page_outside_the_nav_fail_the_build(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guide.md) and [gone](gone.md).\n")
    (docs / "guide.md").write_text("# Guide\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    config.update(docs_dir=str(docs), site_dir=str(tmp_path / "site"), nav=["index.md", "guide.md"])
    config["plugins"] = ["search"]  # mkdocstrings is not needed for these pages
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-f", str(tmp_path / "mkdocs.yml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert any("'index.md' contains a link 'gone.md'" in w for w in warnings), done.stderr
    assert any("orphan.md" in line for line in done.stderr.splitlines()), done.stderr
    assert not any("guide.md" in w for w in warnings)
