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


def test_the_api_says_loss_may_get_a_wrapped_model_and_eval_sums_the_module_itself() -> None:
    """The trainer passes DDP's wrapper to loss() and the bare module to eval_sums(); nothing said
    so, and a loss that reached a submodule (model.head) worked on one process and crashed at 2."""
    from hpcpipe import DatasetRecipe, Recipe

    for loss in (Recipe.loss, DatasetRecipe.loss):
        assert "wrapper" in (loss.__doc__ or "") and "``model(...)`` only" in (loss.__doc__ or "")
    assert "unwrapped" in (Recipe.eval_sums.__doc__ or "")
    tutorial = " ".join((ROOT / "docs" / "your-own-model.md").read_text().split())
    assert "call it as `model(...)` only" in tutorial and "`eval_sums` gets your module itself" in tutorial
