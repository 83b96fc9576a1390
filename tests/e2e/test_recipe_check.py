"""`hpcpipe recipes check` on every built-in recipe: each has every property a recipe must have (the
example from outside, in test_example_recipe.py, too). A property that fails prints its reason,
and the recipe's traceback where its code raised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.recipecheck.runner import PROPERTIES

pytestmark = pytest.mark.timeout(900)

BUILTINS = ["gpt", "resnet-cifar", "lora-function-calling", "hf-causal-lm", "torchvision-classifier"]
SKIPPED = {"resnet-cifar": {"export-loads"}}  # resnet-cifar declares no export format


@pytest.mark.parametrize("recipe", BUILTINS)
def test_every_builtin_recipe_passes_its_check(recipe: str, tmp_path: Path) -> None:
    proc = run_cli(
        "recipe", "check", recipe, "--work", str(tmp_path), "--json", "-", cwd=tmp_path, timeout=800
    )
    report = json.loads(proc.stdout)
    results = {r["name"]: r for r in report["results"]}
    failed = {name: r["detail"] for name, r in results.items() if not (r["passed"] or r["skipped"])}
    assert proc.returncode == 0 and report["passed"] and not failed, failed
    assert list(results) == list(PROPERTIES)
    assert {name for name, r in results.items() if r["skipped"]} == SKIPPED.get(recipe, set())


def test_a_failing_property_is_reported_with_the_recipes_traceback(tmp_path: Path) -> None:
    """A recipe whose loss raises: the properties that train fail, naming the exception, and the
    traceback of the recipe's own code is printed; exit 1."""
    proc = run_cli(
        "recipe",
        "check",
        "tests.recipes_for_tests:Tiny",
        "--set",
        "recipe.activation=gelu",
        "--only",
        "checkpoint-round-trip",
        "--only",
        "loader-repeatable",
        "--work",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "checkpoint-round-trip\tFAIL" in proc.stdout and "loader-repeatable\tPASS" in proc.stdout
    assert "the recipe's code raised" in proc.stderr and "recipes_for_tests.py" in proc.stderr
