"""When a benchmark's local workers fork from a server forked off the launching process
(``bench/runner.py prestart_bench_server``): ranks to come on this node, not one in-process rank,
not a rank of an external launcher."""

from __future__ import annotations

import pytest

from hpcpipe.bench.runner import WORKER_MODULE, prestart_bench_server
from hpcpipe.launch import fork_server

RANK_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "PET_NNODES")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(fork_server, "prestart", lambda preload: seen.append(tuple(preload)) or True)
    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    return seen


def test_local_ranks_fork_from_this_process_with_the_benchmark_worker_first(
    started: list[tuple[str, ...]],
) -> None:
    prestart_bench_server(1)  # one rank runs in-process: no server
    prestart_bench_server(2)
    prestart_bench_server(4, also=("hpcpipe.launch.worker",))
    assert started == [(WORKER_MODULE,), (WORKER_MODULE, "hpcpipe.launch.worker")]


def test_a_rank_of_an_external_launcher_starts_no_server(
    started: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(var, value)  # what torchrun gives its workers
    prestart_bench_server(2)
    assert started == []


def test_a_refusal_keeps_the_tasks_that_finished_before_it(
    started: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task refused in-process (one rank) threw away the results of the tasks before it."""
    from typing import Any

    from hpcpipe.bench import worker
    from hpcpipe.bench.runner import BenchRefused, run_bench
    from hpcpipe.errors import UserError

    def connectivity_then_refuse(spec: dict[str, Any], env: Any, on_result: Any = None) -> None:
        on_result({"connectivity": {"world_size": 1}})
        raise UserError("--sizes: 4G does not fit")

    monkeypatch.setattr(worker, "run_tasks", connectivity_then_refuse)
    with pytest.raises(BenchRefused, match="does not fit") as refused:
        run_bench({"connectivity": {}, "collectives": {}}, nproc=1)
    assert refused.value.partial == {"connectivity": {"world_size": 1}}
    assert isinstance(refused.value, UserError)  # `bench collectives` still exits 2 on it
