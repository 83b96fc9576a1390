"""Which launches fork the workers' server from the launching process (``launch/job.py
prestart_fork_server``): a job with local ranks to come, counted by the most any run will have
(``bench scaling``'s world sizes), and not one in-process worker. And what ``run_job`` refuses
before it writes to the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import UserError
from hpcpipe.launch import job as job_module
from hpcpipe.launch.job import prestart_fork_server, run_job
from hpcpipe.layout import RunLayout


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[JobConfig]:
    seen: list[JobConfig] = []
    monkeypatch.setattr(job_module, "prestart_node_fork_server", seen.append)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    return seen


def test_one_in_process_worker_needs_no_server(started: list[JobConfig]) -> None:
    prestart_fork_server(load_config("tiny", ["parallel.nproc=1"]))
    assert started == []


def test_ranks_to_come_start_it_whether_the_job_or_the_caller_counts_them(started: list[JobConfig]) -> None:
    two = load_config("tiny", ["parallel.nproc=2"])
    prestart_fork_server(two)
    one = load_config("tiny", ["parallel.nproc=1"])
    prestart_fork_server(one, nproc=2)  # bench scaling --nproc 1,2: the N=2 runs fork from it
    prestart_fork_server(one, max_restarts=1)  # restarts: the one worker is not in-process
    assert started == [two, one, one]


def test_new_training_settings_for_a_finished_run_are_refused_and_more_steps_train_on(
    started: list[JobConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpcpipe train` on a run that trained to its last step, with another lr: it resumed,
    trained nothing, exited 0 and recorded the new lr in config.yaml and lineage.json."""
    sets = [f"run.out_dir={tmp_path}", "train.steps=6", "parallel.nproc=1"]
    layout = RunLayout(load_config("tiny", sets).run_dir)
    (layout.checkpoints / "step-00000006").mkdir(parents=True)
    layout.config.write_text(load_config("tiny", sets).to_yaml())
    layout.events.write_text(json.dumps({"event": "run_finished", "step": 6}) + "\n")
    recorded = layout.config.read_text()

    def prepared(job: JobConfig) -> Path:
        raise RuntimeError("prepared")  # the run directory would be written from here on

    monkeypatch.setattr(job_module, "prepare_job", prepared)
    with pytest.raises(UserError) as refused:
        run_job(load_config("tiny", [*sets, "train.lr=0.5", "model.dropout=0.3"]))
    message = str(refused.value)
    assert "already trained to step 6 with other settings (model.dropout 0.0 -> 0.3, train.lr" in message
    assert "give a new run.name to train anew, or more train.steps to train on" in message
    assert layout.config.read_text() == recorded
    with pytest.raises(RuntimeError, match="prepared"):  # a launcher's timeout trains nothing anew
        run_job(load_config("tiny", [*sets, "parallel.timeout_s=60"]))
    with pytest.raises(RuntimeError, match="prepared"):  # more steps: a continuation
        run_job(load_config("tiny", [*sets, "train.steps=8", "train.lr=0.5"]))


class _Counted:
    """A recipe whose training set holds 80 samples (10 steps an epoch at global batch 8)."""

    def prepare(self, progress: bool) -> None:
        pass

    def samples_per_epoch(self) -> int:
        return 80


def test_a_run_counted_in_steps_switched_to_epochs_trains_on_when_they_are_more_steps(
    started: list[JobConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train.epochs was compared with the earlier run's (null): any epochs were refused, and the
    line asked for more train.epochs. Now the epochs' steps (the trainer's rule) are compared."""
    import hpcpipe.recipes

    sets = [f"run.out_dir={tmp_path}", "train.steps=6", "parallel.nproc=1"]
    layout = RunLayout(load_config("tiny", sets).run_dir)
    (layout.checkpoints / "step-00000006").mkdir(parents=True)
    layout.config.write_text(load_config("tiny", sets).to_yaml())
    layout.events.write_text(json.dumps({"event": "run_finished", "step": 6}) + "\n")
    monkeypatch.setattr(hpcpipe.recipes, "build_recipe", lambda job: _Counted())

    def prepared(job: JobConfig) -> Path:
        raise RuntimeError("prepared")  # the run directory would be written from here on

    monkeypatch.setattr(job_module, "prepare_job", prepared)
    with pytest.raises(RuntimeError, match="prepared"):  # 1 epoch: 10 steps, 4 more than 6
        run_job(load_config("tiny", [*sets, "train.epochs=1", "train.lr=0.5"]))
    with pytest.raises(UserError, match=r"or more train\.epochs to train on \(0\.5 end at step 5\)"):
        run_job(load_config("tiny", [*sets, "train.epochs=0.5", "train.lr=0.5"]))


def test_a_finished_run_whose_final_checkpoint_is_in_the_durable_tier_only_is_refused(
    started: list[JobConfig], tmp_path: Path
) -> None:
    """Only the fast tier was read: with it lost (node-local, a new node) the run resumed from
    the durable tier's final checkpoint, trained nothing, exited 0 and recorded the new lr."""
    sets = [
        f"run.out_dir={tmp_path}",
        "train.steps=6",
        "parallel.nproc=1",
        f"checkpoint.dir={tmp_path / 'fast'}",
        f"checkpoint.durable_dir={tmp_path / 'durable'}",
    ]
    layout = RunLayout(load_config("tiny", sets).run_dir)
    (tmp_path / "fast" / "step-00000004").mkdir(parents=True)  # an older one: not where it ended
    (tmp_path / "durable" / "step-00000006").mkdir(parents=True)
    layout.config.parent.mkdir()
    layout.config.write_text(load_config("tiny", sets).to_yaml())
    layout.events.write_text(json.dumps({"event": "run_finished", "step": 6}) + "\n")
    with pytest.raises(UserError, match=r"already trained to step 6 with other settings \(train\.lr"):
        run_job(load_config("tiny", [*sets, "train.lr=0.5"]))


class _PreparedElsewhere(_Counted):
    """A rank that is not its node's preparer: it must not prepare (it reads the prepared data)."""

    def prepare(self, progress: bool) -> None:
        pytest.fail("a rank other than its node's local rank 0 prepared the data")


def test_under_torchrun_only_local_rank_0_prepares_and_every_rank_refuses_after_the_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_job's external branch prepared the data on every rank at once, before the process
    group existed, to count a job's epochs; now the refusal of such a job waits for the node's
    preparation in train_worker, and a job counted in steps is refused before the group starts."""
    import torch

    import hpcpipe.recipes
    from hpcpipe.train import distributed
    from hpcpipe.train.distributed import DistContext
    from hpcpipe.train.environment import DistEnv

    sets = [f"run.out_dir={tmp_path}", "train.steps=6"]
    layout = RunLayout(load_config("tiny", sets).run_dir)
    (layout.checkpoints / "step-00000006").mkdir(parents=True)
    layout.config.write_text(load_config("tiny", sets).to_yaml())
    layout.events.write_text(json.dumps({"event": "run_finished", "step": 6}) + "\n")
    env = DistEnv("torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2)
    monkeypatch.setattr(job_module, "detect_environment", lambda: env)
    monkeypatch.setattr(hpcpipe.recipes, "build_recipe", lambda job: _PreparedElsewhere())
    joined: list[int] = []

    def group(parallel: object, env: DistEnv) -> DistContext:
        joined.append(env.rank)
        return DistContext(1, 1, 2, 2, torch.device("cpu"), None)

    monkeypatch.setattr(distributed, "init_distributed", group)
    with pytest.raises(UserError, match=r"or more train\.epochs to train on \(0\.5 end at step 5\)"):
        run_job(load_config("tiny", [*sets, "train.epochs=0.5", "train.lr=0.5"]))
    assert joined == [1]  # judged in train_worker, after the node's preparation
    with pytest.raises(UserError, match=r"or more train\.steps to train on"):
        run_job(load_config("tiny", [*sets, "train.lr=0.5"]))
    assert joined == [1]  # counted in steps: refused before the group
    written = sorted(p.name for p in layout.config.parent.iterdir())
    assert written == ["checkpoints", "config.yaml", "events.jsonl"]
