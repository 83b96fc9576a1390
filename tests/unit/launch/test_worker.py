"""The worker's own duties around training: its node's Prometheus target file, how it ends."""

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


def test_a_recipe_module_that_raises_ends_the_worker_with_its_traceback_once_per_node_and_no_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank printed hpcpipe's whole traceback (worker, config loading, pydantic, registry)
    and exited 1, which the agent restarted --max-restarts times: the same import fails again."""
    import yaml

    from hpcpipe.launch.agent import terminal_exit_codes
    from hpcpipe.launch.exit import EXIT_DIR_VAR
    from hpcpipe.launch.worker import run

    raw = yaml.safe_load(load_config("tiny").to_yaml())
    raw["run"]["recipe"] = "tests.recipe_raises_on_import:Anything"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(EXIT_DIR_VAR, str(tmp_path))  # a forked worker of the local agent
    codes = [run([str(config)]) for _rank in range(2)]
    err = capsys.readouterr().err
    assert codes[0] == codes[1] and codes[0] in terminal_exit_codes(75), (codes, err)
    assert err.startswith("Traceback") and 'recipe_raises_on_import.py", line 3' in err, err
    assert "worker.py" not in err and "pydantic" not in err and "registry.py" not in err, err
    assert err.count("Traceback") == 1, err  # the second rank of the node says nothing
    assert err.strip().splitlines()[-1].startswith("error: run.recipe 'tests.recipe_raises_on_import")


def test_the_recipe_knows_the_step_trained_to_when_its_training_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What on_train_end exports (a LoRA run's adapter) is the model at that step; its record
    names it, so register weighs it against the checkpoints' exports."""
    job, _ = _job(tmp_path)
    seen: list[int | None] = []
    build = recipes.build_recipe

    def built(job: JobConfig) -> Recipe:
        recipe = build(job)
        monkeypatch.setattr(recipe, "on_train_end", lambda *args: seen.append(recipe.trained_step))
        return recipe

    monkeypatch.setattr(recipes, "build_recipe", built)
    train_worker(job, SINGLE)
    assert seen == [1]
