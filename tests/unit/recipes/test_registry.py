"""run.recipe resolves to a recipe class: a registered name (hpcpipe's built-ins are entry points
too) or an import path; every mistake is one line naming run.recipe, the class or the method, and
the recipe's own section is checked like any other."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpcpipe.config import JobConfig, apply_values, load_config, with_overrides
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.hpo.space import check_space, maximize
from hpcpipe.recipes import registry
from hpcpipe.recipes.base import Recipe
from hpcpipe.recipes.registry import recipe_class

ROOT = Path(__file__).resolve().parents[3]
TINY = "tests.recipes_for_tests:Tiny"
# The same words meaning something else: ShareGPT's name for the assistant role.
NOT_RECIPES = {"data/function_calling/formats.py: gpt"}


def _job(ref: str, **values: object) -> JobConfig:
    return apply_values(load_config("tiny"), {"run.recipe": ref, **values})


def test_the_builtins_are_entry_points_of_hpcpipe_whose_names_are_their_classes() -> None:
    builtin = {name: e for name, e in registry.registry().recipes.items() if e.builtin}
    assert set(builtin) == {
        "gpt",
        "resnet-cifar",
        "lora-function-calling",
        "hf-causal-lm",
        "torchvision-classifier",
    }
    for name in builtin:
        cls = recipe_class(name)
        assert cls.name == name and issubclass(cls, Recipe) and cls.__module__.startswith("hpcpipe.recipes.")
        assert "val_loss" in cls.metric_goals


def test_a_builtin_recipe_is_its_module_and_its_preset() -> None:
    """Adding a built-in recipe is its module (registered in pyproject.toml as any package's
    recipe is) and a preset: every recipe module is an entry point and has a preset, and no other
    module of hpcpipe spells a recipe's name in a comparison or a table (the recipe dispatches)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points = pyproject["project"]["entry-points"]["hpcpipe.recipes"]
    src = ROOT / "src" / "hpcpipe"
    presets = [load_config(p.stem) for p in (src / "presets").glob("*.yaml")]
    for name, target in points.items():
        module = target.partition(":")[0]
        assert (src / "recipes" / f"{module.rsplit('.', 1)[-1]}.py").is_file()
        assert any(job.run.recipe == name for job in presets), f"no preset runs {name}"
    spelled = []
    for path in src.rglob("*.py"):
        own = {name for name, target in points.items() if target.partition(":")[0] == _module(path)}
        for node in ast.walk(ast.parse(path.read_text())):
            names = _dispatching_strings(node)
            spelled += [f"{path.relative_to(src)}: {n}" for n in names & set(points) - own]
    assert set(spelled) <= NOT_RECIPES, "recipe names spelled outside their recipe: " + "; ".join(spelled)


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)


def _dispatching_strings(node: ast.AST) -> set[str]:
    """String constants compared against (``x == "gpt"``) or used as dict keys."""
    found: set[str] = set()
    if isinstance(node, ast.Compare):
        for side in [node.left, *node.comparators]:
            if isinstance(side, ast.Constant) and isinstance(side.value, str):
                found.add(side.value)
    elif isinstance(node, ast.Dict):
        found |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return found


def test_an_import_path_names_a_recipe_of_the_users_own() -> None:
    job = _job(TINY)
    assert recipe_class(job.run.recipe).name == "tiny-regression"
    defaults = {"hidden": 8, "samples": 64, "activation": "relu", "val_samples": 16, "dropout": 0.0}
    defaults["inputs"] = "float32"
    assert job.recipe == defaults  # every default filled in
    assert "recipe:\n  hidden: 8" in job.to_yaml()


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("no.such.module:Recipe", "run.recipe 'no.such.module:Recipe': cannot import 'no.such.module'"),
        ("tests.recipes_for_tests:Nothing", "has no attribute 'Nothing'"),
        (
            "tests.recipes_for_tests:MissingLoss",
            "tests.recipes_for_tests.MissingLoss does not implement loss",
        ),
        ("tests.recipes_for_tests:NotARecipe", "is not a recipe: derive it from hpcpipe.Recipe"),
        ("tests.recipes_for_tests:NoValLoss", "metric_goals must map each evaluation metric"),
        ("tests.recipes_for_tests:BadName", ".name must be a class attribute of 1-63 lower-case"),
        ("no-such-recipe", "unknown recipe 'no-such-recipe' (registered: gpt,"),
        # A file where a module belongs: a TypeError traceback, or "no module 'good.py'".
        ("./tests/recipes_for_tests.py:Tiny", "not a file: write tests.recipes_for_tests:Tiny"),
        (".recipes_for_tests:Tiny", "not a file: write recipes_for_tests:Tiny"),
        ("recipes_for_tests.py:Tiny", "not a file: write recipes_for_tests:Tiny"),
    ],
)
def test_a_recipe_that_cannot_be_used_is_one_line_naming_it(ref: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("tiny", [f"run.recipe={ref}"])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_module_of_the_working_directory_that_an_installed_package_hides_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """yaml.py here: the error was "module 'yaml' has no attribute 'Mine'", about PyYAML."""
    (tmp_path / "yaml.py").write_text("class Mine: pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'yaml' is the installed package at .*rename your module"):
        recipe_class("yaml:Mine")


def test_an_args_default_that_breaks_its_own_rule_is_named_when_the_job_loads() -> None:
    """Pydantic leaves defaults unchecked: the default was written out and the recipe's start
    ended in a ValidationError traceback."""
    with pytest.raises(ConfigError, match=r"recipe.hidden: .* \(got 0\) \(its default in the Args of recipe"):
        load_config("tiny", ["run.recipe=tests.recipes_for_tests:BadDefault"])


def test_a_missing_method_is_named() -> None:
    with pytest.raises(ConfigError, match=r"MissingLoss does not implement loss$"):
        recipe_class("tests.recipes_for_tests:MissingLoss")
    with pytest.raises(
        ConfigError, match=r"Recipe does not implement build_model, eval_batches, .*train_loader$"
    ):
        recipe_class("hpcpipe.recipes.base:Recipe")


def test_a_recipe_module_that_raises_is_named_with_its_line_and_keeps_its_exception() -> None:
    """A bug in the author's module is no bad input: it was a ConfigError (exit 2, no traceback)."""
    with pytest.raises(registry.RecipeImportError) as err:
        recipe_class("tests.recipe_raises_on_import:Anything")
    message = str(err.value)
    assert (
        "raised ZeroDivisionError at " in message
        and "recipe_raises_on_import.py:3: division by zero" in message
    )
    assert "\n" not in message and isinstance(err.value.__cause__, ZeroDivisionError)
    trace = err.value.user_traceback()
    assert trace.startswith("Traceback") and "importlib" not in trace and "registry.py" not in trace
    assert 'recipe_raises_on_import.py", line 3' in trace


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def broken(:\n", "raised SyntaxError at "),
        ("import not_a_package_anyone_has\n", "raised ModuleNotFoundError at "),
    ],
)
def test_a_recipe_module_that_cannot_import_is_named_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, needle: str
) -> None:
    (tmp_path / "mybroken_recipe.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.RecipeImportError) as err:
        recipe_class("mybroken_recipe:R")
    assert needle in str(err.value) and "mybroken_recipe.py:1" in str(err.value), err.value


@pytest.mark.parametrize("verb", [["train", "tiny"], ["recipes", "check"]])
def test_the_cli_shows_a_recipe_modules_own_traceback_and_exits_1(
    verb: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hpcpipe train` and `recipes check` said exit 2 and one line, as if the job were wrong. A
    ValueError too: the config's validators, which look the recipe up, would make it a config error."""
    import sys

    from hpcpipe.cli.app import main

    (tmp_path / "valueerror_recipe.py").write_text("import math\n\nLIMIT = math.sqrt(-1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = "valueerror_recipe:R"
    args = [*verb, "--set", f"run.recipe={ref}"] if verb[0] == "train" else [*verb, ref]
    monkeypatch.setattr(sys, "argv", ["hpcpipe", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 1, err
    assert err.startswith("Traceback") and 'valueerror_recipe.py", line 3' in err
    assert "ValueError: math domain error" in err and "importlib" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: run.recipe {ref!r}: importing")


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (
            ["recipe.hiden=16"],
            "unknown config key 'recipe.hiden' (keys in recipe (tiny-regression): hidden, samples",
        ),
        (["recipe.hidden=abc"], "recipe.hidden: Input should be a valid integer"),
        (["recipe.hidden=0"], "recipe.hidden: Input should be greater than or equal to 1 (got 0)"),
        (["recipe.samples=[1, 2]"], "recipe.samples: Input should be a valid integer"),
        (["recipe.hidden=true"], "recipe.hidden: expected a number, not true or false"),  # trained with 1
        (["recipe.dropout=.inf"], "recipe.dropout: expected a finite number (got inf)"),
    ],
)
def test_recipe_arguments_are_checked_when_the_job_loads(sets: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("tiny", [f"run.recipe={TINY}", *sets])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_recipe_without_arguments_refuses_any(tmp_path: Path) -> None:
    assert recipe_class("resnet-cifar").Args is None
    with pytest.raises(
        ConfigError,
        match=re.escape("unknown config key 'recipe.hidden' (recipe 'resnet-cifar' takes no arguments)"),
    ):
        load_config("resnet-tiny", ["recipe.hidden=3"])
    job_file = tmp_path / "job.yaml"
    job_file.write_text("run:\n  recipe: resnet-cifar\nrecipe:\n  hidden: 3\n")
    with pytest.raises(ConfigError, match=re.escape("job.yaml: unknown config key 'recipe.hidden'")):
        load_config(job_file)


def test_set_parses_a_recipe_argument_to_its_type_and_it_changes_the_training_hash() -> None:
    base = _job(TINY)
    wider = with_overrides(base, ["recipe.hidden=16", "recipe.activation=123"])
    assert wider.recipe["hidden"] == 16 and wider.recipe["activation"] == "123"  # a str stays a str
    assert wider.training_hash() != base.training_hash()


def test_hpo_searches_a_recipe_argument_and_takes_its_goal() -> None:
    job = apply_values(
        _job(TINY),
        {"hpo.metric": "val_r2", "hpo.space": {"recipe.hidden": {"type": "int", "low": 4, "high": 32}}},
    )
    check_space(job)
    assert maximize(job)  # val_r2's goal is max
    bad = apply_values(job, {"hpo.space": {"recipe.hidden": {"type": "int", "low": 0, "high": 32}}})
    with pytest.raises(
        UserError, match=r"hpo\.space\.recipe\.hidden: .*Input should be greater than or equal to 1"
    ):
        check_space(bad)


def _fake_distribution(root: Path, dist: str, entry_points: str) -> None:
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hpcpipe.recipes]\n{entry_points}\n")


def test_an_installed_package_registers_a_recipe_and_one_that_reuses_a_builtin_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, "team-recipes", "tiny-regression = tests.recipes_for_tests:Tiny")
    _fake_distribution(tmp_path, "evil-recipes", "gpt = tests.recipes_for_tests:Tiny")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    try:
        assert registry.registry().recipes["tiny-regression"].package == "team-recipes"
        assert recipe_class("tiny-regression") is recipe_class(TINY)
        with pytest.raises(ConfigError) as err:
            load_config("tiny")  # run.recipe: gpt
        message = str(err.value)
        assert (
            "run.recipe 'gpt'" in message
            and "evil-recipes reuses the name of hpcpipe's built-in recipe" in message
            and "uninstall it (pip uninstall evil-recipes), or rename its entry point" in message
        )
        from typer.testing import CliRunner

        from hpcpipe.cli.app import app

        listed = CliRunner().invoke(app, ["recipes", "list"], env={"COLUMNS": "400"})
        assert '[project.entry-points."hpcpipe.recipes"]' in listed.output  # rich ate it as markup
        # `presets list` aborted on the first gpt preset: the others, and why those are unusable.
        presets = CliRunner().invoke(app, ["presets", "list"])
        assert presets.exit_code == 0, presets.output
        rows = {line.split("\t")[0]: line.split("\t") for line in presets.output.splitlines()}
        assert rows["tiny"][1].startswith("unusable: ") and "pip uninstall evil-recipes" in rows["tiny"][1]
        assert rows["resnet-tiny"][1].startswith("torchvision resnet18")
    finally:
        monkeypatch.undo()
        registry.refresh()
    assert recipe_class("gpt").__module__ == "hpcpipe.recipes.gpt"


def test_an_entry_point_whose_class_has_another_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, "misnamed", "regression = tests.recipes_for_tests:Tiny")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    try:
        with pytest.raises(
            ConfigError, match="is named 'tiny-regression'; the entry point's name and the class's"
        ):
            recipe_class("regression")
    finally:
        monkeypatch.undo()
        registry.refresh()


def test_reading_a_builtin_recipes_declaration_imports_no_torch() -> None:
    code = (
        "import sys\nfrom hpcpipe.config import load_config\n"
        "for preset in ('tiny', 'resnet-tiny', 'lora-fc-tiny', 'hf-causal-lm-tiny', 'torchvision-tiny'):\n"
        "    load_config(preset)\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_switching_run_recipe_drops_the_previous_recipes_arguments(tmp_path: Path) -> None:
    """A loaded gpt job holds recipe.sample_tokens; naming another recipe starts from its own
    defaults (and the recipe.* keys given with it), whichever way the switch comes."""
    assert load_config("tiny").recipe == {"sample_tokens": 200}
    assert _job(TINY).recipe["hidden"] == 8
    switched = with_overrides(load_config("tiny"), [f"run.recipe={TINY}", "recipe.hidden=5"])
    assert switched.recipe["hidden"] == 5
    saved = tmp_path / "config.yaml"
    saved.write_text(load_config("tiny", ["recipe.sample_tokens=7"]).to_yaml())
    assert load_config(saved).recipe == {"sample_tokens": 7}  # the same recipe keeps its keys
    assert "sample_tokens" not in load_config(saved, [f"run.recipe={TINY}"]).recipe


def test_gpt_writes_no_sample_when_sample_tokens_is_0(tmp_path: Path) -> None:
    from hpcpipe.recipes import build_recipe

    class Generates:
        def generate(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("no token may be generated")

    recipe = build_recipe(load_config("tiny", ["recipe.sample_tokens=0"]))
    assert recipe.args.sample_tokens == 0
    recipe.on_train_end(Generates(), True, tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_key_inside_a_nested_argument_is_refused() -> None:
    """pydantic drops it by default: `{opt: {lrr: 5}}` in a job file trained with the default lr,
    where `--set recipe.opt.lrr=5` was refused."""
    from pydantic import BaseModel

    from hpcpipe.recipes.args import validate_args

    class Opt(BaseModel):
        lr: float = 0.1

    class Args(BaseModel):
        opt: Opt = Opt()

    with pytest.raises(ConfigError, match=r"unknown config key 'recipe\.opt\.lrr' \(keys in recipe\.opt"):
        validate_args(Args, {"opt": {"lrr": 5}}, "r")
    assert validate_args(Args, {"opt": {"lr": 0.5}}, "r") == {"opt": {"lr": 0.5}}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"opts": [{"lr": 1, "lrr": 2}]}, "unknown config key 'recipe.opts.0.lrr'"),
        ({"by_name": {"a": {"lrr": 2}}}, "unknown config key 'recipe.by_name.a.lrr'"),
        ({"opts": [{"lr": True}]}, "recipe.opts.0.lr: expected a number, not true or false"),
        ({"scale": "inf"}, "recipe.scale: expected a finite number (got inf)"),  # YAML's "inf" is text
        ({"scale": "NaN"}, "recipe.scale: expected a finite number (got NaN)"),
    ],
)
def test_lists_and_dicts_of_nested_arguments_and_text_infinities_are_checked(raw: dict, needle: str) -> None:  # type: ignore[type-arg]
    from pydantic import BaseModel

    from hpcpipe.recipes.args import validate_args

    class Opt(BaseModel):
        lr: float = 0.1

    class Args(BaseModel):
        opts: list[Opt] = []
        by_name: dict[str, Opt] = {}
        scale: float = 1.0

    with pytest.raises(ConfigError) as err:
        validate_args(Args, raw, "r")
    assert needle in str(err.value)


def test_the_lora_recipe_stages_its_adapter_and_records_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """peft wrote export/adapter in place, unrecorded: a kill mid-write left a partial adapter."""
    import json
    from types import SimpleNamespace

    from hpcpipe.models import lora_export
    from hpcpipe.recipes.lora_fc import LoraFCRecipe

    def save_adapter(model: object, state: object, out: Path, tokenizer: object = None) -> Path:
        assert out.parent == adapter and out.name.startswith(".partial-")  # staged, not in place
        (out / "adapter_model.safetensors").write_text("lora")
        return out

    adapter = tmp_path / "export" / "adapter"
    monkeypatch.setattr(lora_export, "full_adapter_state", lambda model: {})
    monkeypatch.setattr(lora_export, "save_adapter", save_adapter)
    recipe = object.__new__(LoraFCRecipe)  # what on_train_end reads of it, without a model source
    recipe.__dict__["chat"] = SimpleNamespace(tokenizer=None)
    recipe.trained_step = 500
    recipe.on_train_end(None, True, tmp_path)  # type: ignore[arg-type]
    recipe._export_adapter(adapter)  # on_run_end's first work
    record = json.loads((adapter / ".hpcpipe-export").read_text())
    assert record == {"format": "adapter", "step": 500, "files": ["adapter_model.safetensors"]}


def test_the_lora_adapter_is_written_past_the_last_barrier_waiting_for_a_register(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main rank wrote it in on_train_end, refusing at once when a register was uploading the
    earlier adapter: the worker exited 2 and left the other ranks in the group's last barrier."""
    import fcntl
    import os
    import threading
    from types import SimpleNamespace

    from hpcpipe.checkpoint.export_record import LOCK
    from hpcpipe.models import lora_export
    from hpcpipe.recipes import lora_fc

    def save_adapter(model: object, state: object, out: Path, tokenizer: object = None) -> Path:
        (out / "adapter_model.safetensors").write_text("lora")
        return out

    adapter = tmp_path / "export" / "adapter"
    adapter.mkdir(parents=True)
    monkeypatch.setattr(lora_export, "full_adapter_state", lambda model: {})
    monkeypatch.setattr(lora_export, "save_adapter", save_adapter)
    monkeypatch.setattr(lora_fc, "ADAPTER_WAIT_S", 30.0)
    recipe = object.__new__(lora_fc.LoraFCRecipe)
    recipe.__dict__["chat"] = SimpleNamespace(tokenizer=None)
    recipe.trained_step = 7
    reader = os.open(adapter / LOCK, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(reader, fcntl.LOCK_SH)  # a register uploading the earlier adapter
    recipe.on_train_end(None, False, tmp_path)  # type: ignore[arg-type]
    recipe.on_train_end(None, True, tmp_path)  # type: ignore[arg-type]
    assert not (adapter / "adapter_model.safetensors").exists()  # the other ranks go on to the barrier
    threading.Timer(0.3, os.close, [reader]).start()
    recipe._export_adapter(adapter)  # past the barrier: waits for the upload to end
    assert (adapter / "adapter_model.safetensors").read_text() == "lora"
