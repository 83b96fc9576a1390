"""The worker's own duties around training: here, its node's Prometheus target file."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import tiny_job_sets

from hpcpipe import recipes
from hpcpipe.config import JobConfig, load_config
from hpcpipe.launch.worker import train_worker
from hpcpipe.netutil import free_port
from hpcpipe.observe.prometheus import sd_targets_path
from hpcpipe.recipes.base import Recipe
from hpcpipe.train.environment import DistEnv, node_name
from hpcpipe.train.preempt import Preempted
from hpcpipe.train.trainer import Trainer

SINGLE = DistEnv(kind="single", rank=0, local_rank=0, world_size=1, local_world_size=1)


def _job(tmp_path: Path) -> tuple[JobConfig, Path]:
    sets = tiny_job_sets(
        tmp_path, "sd", "train.steps=1", "observe.progress=false", f"observe.prometheus.port={free_port()}"
    )
    job = load_config("tiny", sets[1::2])
    return job, sd_targets_path(tmp_path, job.observe.prometheus, job.run.name, node_name())


def test_the_target_file_goes_before_the_recipes_run_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_run_end (minutes of LoRA calibration) ran with the exporters closed and the file still
    listing them: HpcpipeRankDown fired on a run that succeeded."""
    job, targets = _job(tmp_path)
    seen: list[bool] = []
    fit, build = Trainer.fit, recipes.build_recipe

    def fitted(self: Trainer) -> None:
        seen.append(targets.exists())
        fit(self)

    def built(job: JobConfig) -> Recipe:
        recipe = build(job)
        monkeypatch.setattr(recipe, "on_run_end", lambda run_dir: seen.append(targets.exists()))
        return recipe

    monkeypatch.setattr(Trainer, "fit", fitted)
    monkeypatch.setattr(recipes, "build_recipe", built)
    train_worker(job, SINGLE)
    assert seen == [True, False]  # advertised while training, gone before on_run_end


def test_a_preempted_run_withdraws_its_target_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted or pruned run's file stayed for ever: Prometheus keeps a target a file lists."""
    job, targets = _job(tmp_path)

    def preempted(self: Trainer) -> None:
        assert targets.exists()
        raise Preempted(self.step)

    monkeypatch.setattr(Trainer, "fit", preempted)
    with pytest.raises(Preempted):
        train_worker(job, SINGLE)
    assert not targets.exists()
