"""A DatasetRecipe on 2 gloo ranks where the data are awkward: a validation set smaller than the
world (a rank with nothing to evaluate runs padding forwards for FSDP2's collectives, and every
sample counts once), dropout, whose stream a resumed run must replay bit for bit, and BatchNorm,
whose running statistics each rank updates from its own batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.observe.metrics import read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

OWN = "run.recipe=tests.recipes_for_tests:Tiny"


def _train(tmp: Path, name: str, nproc: int, *sets: str) -> Path:
    base = [
        OWN,
        f"run.name={name}",
        f"run.out_dir={tmp}",
        "train.steps=2",
        "train.eval_every=2",
        "observe.log_every=1",
    ]
    args = [a for s in [*base, *sets] for a in ("--set", s)]
    proc = run_cli("train", "tiny", "--nproc", str(nproc), *args, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / name


def test_a_validation_set_smaller_than_the_world_counts_each_sample_once_under_fsdp2(tmp_path: Path) -> None:
    one = _train(tmp_path, "one", 1, "recipe.val_samples=1")
    two = _train(tmp_path, "two", 2, "recipe.val_samples=1", "parallel.strategy=fsdp")
    evals = [{r["step"]: r["val_loss"] for r in read_metrics(run) if "val_loss" in r} for run in (one, two)]
    assert evals[1][0] == pytest.approx(evals[0][0], rel=1e-6)  # one sample, counted once, on rank 0


def test_a_killed_rank_resumes_bit_for_bit_with_dropout(tmp_path: Path) -> None:
    only = ["--only", "resume-after-kill"]
    proc = run_cli(
        "recipe", "check", "tests.recipes_for_tests:Tiny", "--set", "recipe.dropout=0.5", *only,
        "--work", str(tmp_path / "check"), "--json", "-", cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["results"]


def _checkpoint_val_loss(run: Path, step: int) -> float:
    """The run's checkpoint of ``step`` evaluated in this process, on one rank's view of the data."""
    import torch

    from hpcpipe.checkpoint.export import load_weights
    from hpcpipe.config import load_config
    from hpcpipe.recipes import build_recipe

    recipe = build_recipe(load_config(str(run / "config.yaml"), []))
    model = recipe.build_model()
    load_weights(run / "checkpoints" / f"step-{step:08d}", model)
    model.eval()
    totals: dict[str, float] = {}
    with torch.no_grad():
        for batch in recipe.eval_batches(0, 1):
            for key, value in recipe.eval_sums(model, tuple(batch)).items():  # type: ignore[arg-type]
                totals[key] = totals.get(key, 0.0) + float(value)
    return recipe.eval_metrics(totals)["val_loss"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_batchnorm_evaluations_checkpoints_and_resumes_describe_one_model(
    tmp_path: Path, strategy: str
) -> None:
    """Without a per-forward broadcast each rank kept its own running statistics: the logged
    val_loss averaged ranks of different statistics, the checkpoint held others, and a resumed
    run (every rank from the checkpoint's) evaluated otherwise than the uninterrupted one."""
    sets = [
        "run.recipe=tests.recipes_for_tests:BatchNormTiny", f"parallel.strategy={strategy}",
        "checkpoint.every_steps=3", "train.eval_every=3", "train.schedule=constant",
    ]  # fmt: skip

    def val_losses(run: Path) -> dict[int, float]:
        return {r["step"]: r["val_loss"] for r in read_metrics(run) if "val_loss" in r}

    whole = _train(tmp_path, "whole", 2, *sets, "train.steps=6")
    logged = val_losses(whole)
    assert logged[6] == pytest.approx(_checkpoint_val_loss(whole, 6), rel=1e-6)
    _train(tmp_path, "resumed", 2, *sets, "train.steps=3")
    resumed = val_losses(_train(tmp_path, "resumed", 2, *sets, "train.steps=6"))
    assert resumed == pytest.approx(logged, rel=1e-6)
