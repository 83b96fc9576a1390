"""How many intra-op threads a rank takes: the config's, else the launcher's OMP_NUM_THREADS
(Slurm's cpus_per_task share, torchrun's 1), else its usable cores shared by the node's ranks."""

from __future__ import annotations

import os

import pytest

from hpcpipe.config import ParallelConfig
from hpcpipe.train.distributed import intra_op_threads
from hpcpipe.train.environment import DistEnv


def _env(local_world_size: int) -> DistEnv:
    return DistEnv("torchrun", 0, 0, local_world_size, local_world_size)


def test_the_config_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert intra_op_threads(ParallelConfig(threads_per_rank=5), _env(2)) == 5


def test_a_launchers_omp_num_threads_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert intra_op_threads(ParallelConfig(), _env(8)) == 3


@pytest.mark.parametrize("value", ["", "0", "two", "-1"])
def test_otherwise_the_usable_cores_are_shared_by_the_nodes_ranks(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(6)), raising=False)
    assert intra_op_threads(ParallelConfig(), _env(2)) == 3  # 6 usable cores (not the machine's)
    assert intra_op_threads(ParallelConfig(), _env(8)) == 1  # never 0


def test_nccl_without_a_gpu_is_one_line_naming_the_key() -> None:
    import torch

    from hpcpipe.errors import ConfigError
    from hpcpipe.train.distributed import _pick_backend

    with pytest.raises(ConfigError, match=r"parallel.backend=nccl needs CUDA GPUs"):
        _pick_backend(ParallelConfig(backend="nccl"), torch.device("cpu"))
    assert _pick_backend(ParallelConfig(), torch.device("cpu")) == "gloo"
