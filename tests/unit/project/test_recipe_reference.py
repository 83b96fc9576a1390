"""docs/reference/recipe-api.md is generated from the code (scripts/build_recipe_reference.py):
the committed file must be what the script writes now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_recipe_api_reference_is_current(tmp_path: Path) -> None:
    out = tmp_path / "recipe-api.md"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_recipe_reference.py"), str(out)],
        check=True,
        timeout=120,
    )
    committed = (ROOT / "docs" / "reference" / "recipe-api.md").read_text()
    assert out.read_text() == committed, "run: .venv/bin/python scripts/build_recipe_reference.py"
    for name in ("hpcpipe.Recipe", "hpcpipe.DatasetRecipe", "hpcpipe.Datasets", "hpcpipe.testing"):
        assert f"## `{name}`" in committed
