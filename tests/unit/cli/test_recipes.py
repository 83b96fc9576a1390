"""`hpcpipe recipes list|show|check` and `hpcpipe new recipe` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli


def test_list_shows_every_builtin_recipe_with_its_package() -> None:
    proc = run_cli("recipes", "list")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("\t")[0]: line.split("\t") for line in proc.stdout.splitlines()[1:]}
    for name in ("gpt", "resnet-cifar", "lora-function-calling", "hf-causal-lm", "torchvision-classifier"):
        assert rows[name][1] == "hpcpipe 0.1.0" and rows[name][2]
    listed = json.loads(run_cli("recipes", "list", "--json", "-").stdout)
    assert {r["name"] for r in listed["recipes"]} >= set(rows)


def test_show_gives_the_declaration_and_the_arguments_with_defaults() -> None:
    proc = run_cli("recipes", "show", "hf-causal-lm", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["class"] == "hpcpipe.recipes.hf_causal_lm:HFCausalLMRecipe" and shown["package"] == "hpcpipe"
    assert shown["metric_goals"] == {"val_loss": "min", "val_ppl": "min"}
    [finetune] = shown["args"]
    assert finetune["key"] == "finetune" and finetune["default"] == "lora" and "full" in finetune["type"]
    table = run_cli("recipes", "show", "tests.recipes_for_tests:Tiny")
    assert table.returncode == 0, table.stderr
    assert "recipe.hidden\tint\t8\tHidden width." in table.stdout and "val_r2 (max)" in table.stdout


def test_an_unknown_recipe_is_one_line_and_exit_2() -> None:
    proc = run_cli("recipe", "show", "nope")
    assert proc.returncode == 2 and proc.stderr.startswith("error: run.recipe: unknown recipe 'nope'")
    proc = run_cli("recipe", "check", "tests.recipes_for_tests:NotARecipe")
    assert proc.returncode == 2 and "is not a recipe" in proc.stderr
    proc = run_cli("recipe", "check", "gpt", "--only", "everything")
    assert (
        proc.returncode == 2 and "--only everything: not a property (known: loader-repeatable" in proc.stderr
    )


def test_check_runs_the_properties_it_is_asked_for(tmp_path: Path) -> None:
    only = ["--only", "loader-repeatable", "--only", "loader-world-sizes", "--only", "bad-args-refused"]
    proc = run_cli(
        "recipe", "check", "tests.recipes_for_tests:Tiny", *only, "--work", str(tmp_path), "--json", "-"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] and [r["name"] for r in report["results"]] == only[1::2]
    assert "recipe.hidden='not a value' refused" in report["results"][2]["detail"]


def test_a_check_that_built_an_optimizer_ends_without_triton_s_leak_report(tmp_path: Path) -> None:
    """torch's optimizers load triton (torch._dynamo); triton 3.9's bindings printed ~60 lines of
    "nanobind: leaked ..." at interpreter teardown, after the PASS line."""
    only = ["--only", "checkpoint-round-trip", "--only", "parity-fsdp"]  # these two leave the report
    # A fresh interpreter (prefix []): a run forked from the test's zygote leaves without a teardown.
    args = ["recipe", "check", "tests.recipes_for_tests:Tiny", *only, "--work", str(tmp_path)]
    proc = run_cli(*args, prefix=[])
    assert proc.returncode == 0, proc.stderr
    assert "nanobind" not in proc.stderr and "PASS recipe" in proc.stdout, proc.stderr[-2000:]


def test_new_recipe_writes_a_package_and_refuses_a_bad_name_or_a_used_directory(tmp_path: Path) -> None:
    proc = run_cli("new", "recipe", "my-model", "--dir", str(tmp_path / "pkg"))
    assert proc.returncode == 0, proc.stderr
    pkg = tmp_path / "pkg"
    assert 'my-model = "my_model.recipe:MyModelRecipe"' in (pkg / "pyproject.toml").read_text()
    assert "class MyModelRecipe(hpcpipe.DatasetRecipe):" in (pkg / "src/my_model/recipe.py").read_text()
    assert 'assert_recipe_passes("my-model"' in (pkg / "tests/test_recipe.py").read_text()
    # The Dockerfile copies the folder, where training writes runs/: checkpoints went into the image.
    ignored = {line for line in (pkg / ".dockerignore").read_text().splitlines() if not line.startswith("#")}
    assert {"runs", ".venv", "**/*.egg-info", ".git", "**/__pycache__"} <= ignored
    again = run_cli("new", "recipe", "my-model", "--dir", str(pkg))
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
    bad = run_cli("new", "recipe", "My Model", cwd=tmp_path)
    assert bad.returncode == 2 and "NAME 'My Model': use lower-case letters" in bad.stderr
    # A built-in's name: installed, the package's recipe and hpcpipe's own became unusable.
    taken = run_cli("new", "recipe", "resnet-cifar", cwd=tmp_path)
    assert taken.returncode == 2 and "a recipe of hpcpipe has that name" in taken.stderr
    # An installed distribution's name (its module is `yaml`): `pip install -e` would replace it.
    dist = run_cli("new", "recipe", "pyyaml", cwd=tmp_path)
    assert dist.returncode == 2 and "an installed distribution has that name" in dist.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # nothing written for the bad name
