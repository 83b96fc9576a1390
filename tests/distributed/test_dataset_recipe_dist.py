"""A DatasetRecipe on 2 gloo ranks where the data are awkward: a validation set smaller than the
world (a rank with nothing to evaluate runs padding forwards for FSDP2's collectives, and every
sample counts once), and dropout, whose stream a resumed run must replay bit for bit."""

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
