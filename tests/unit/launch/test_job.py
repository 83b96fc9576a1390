"""Which launches fork the workers' server from the launching process (``launch/job.py
prestart_fork_server``): a job with local ranks to come, counted by the most any run will have
(``bench scaling``'s world sizes), and not one in-process worker."""

from __future__ import annotations

import pytest

from hpcpipe.config import JobConfig, load_config
from hpcpipe.launch import job as job_module
from hpcpipe.launch.job import prestart_fork_server


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
