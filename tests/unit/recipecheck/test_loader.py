"""The loader's properties of `hpcpipe recipes check`: whatever the recipe declares about its data
order, 2 ranks must get other samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcpipe.recipecheck.runner import PropertyResult, check_recipe


def _world_sizes(ref: str, work: Path, *sets: str) -> tuple[bool, str]:
    result = _result(ref, work, *sets)
    assert not result.skipped, result.detail
    return result.passed, result.detail


def _result(ref: str, work: Path, *sets: str) -> PropertyResult:
    return check_recipe(ref, sets=sets, work=work, only=("loader-world-sizes",)).results[0]


def test_a_loader_that_ignores_its_rank_fails_though_its_order_depends_on_the_world_size(
    tmp_path: Path,
) -> None:
    """world_size_invariant_order = False skipped this property and parity-ddp, and parity-fsdp
    compared DDP with FSDP2 on the same unsharded data: such a recipe passed every property."""
    passed, detail = _world_sizes("tests.recipes_for_tests:RankBlind", tmp_path)
    assert not passed
    assert detail.startswith("8 of the 8 samples of rank 1's first micro-batch are in rank 0's")
    assert "must shard by rank" in detail


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("tests.recipes_for_tests:WorldSizedOrder", "(8 samples each); the global batch not compared"),
        ("tests.recipes_for_tests:Tiny", "disjoint (8 samples each); 16 samples of step 1 equal"),
    ],
)
def test_a_sharded_loader_passes_with_either_order(tmp_path: Path, ref: str, needle: str) -> None:
    passed, detail = _world_sizes(ref, tmp_path)
    assert passed and needle in detail, detail


def test_data_smaller_than_a_step_cannot_tell_the_ranks_samples_apart(tmp_path: Path) -> None:
    """The check's data of lora-function-calling packs into 2 rows for a step of 4: every loader
    repeats a sample there, sharded or not. The global batch is still compared where the order
    allows; where it does not, nothing was compared, and the property said PASS."""
    passed, detail = _world_sizes("tests.recipes_for_tests:Tiny", tmp_path / "a", "recipe.samples=8")
    assert passed and detail.startswith("ranks not compared (step 1 at 1 rank repeats a sample"), detail
    assert detail.endswith("samples of step 1 equal"), detail
    result = _result("tests.recipes_for_tests:WorldSizedOrder", tmp_path / "b", "recipe.samples=8")
    assert result.skipped and not result.passed, result
    assert result.detail.startswith("ranks not compared") and "the global batch not compared" in result.detail


def test_a_loader_without_close_is_checked(tmp_path: Path) -> None:
    """close() is optional for a recipe's own loader (the trainer skips it); the check called it
    and failed such a recipe with AttributeError."""
    from types import SimpleNamespace

    from hpcpipe.recipecheck.loader import micro_batches

    loader = SimpleNamespace(next_microbatch=lambda: "batch", load_state_dict=lambda state: None)
    recipe = SimpleNamespace(train_loader=lambda rank, world_size: loader)
    assert micro_batches(recipe, 0, 1, 2, state={}) == ["batch", "batch"]  # type: ignore[arg-type]
