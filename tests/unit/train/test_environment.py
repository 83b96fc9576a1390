"""LR schedule shape and cluster-environment detection (torchrun, Kubeflow, Slurm, single)."""

from __future__ import annotations

import itertools

import pytest

from hpcpipe.config import TrainConfig
from hpcpipe.train.environment import DistEnv, _parse_first_host, detect_environment


def test_warmup_then_cosine_to_floor() -> None:
    cfg = TrainConfig(steps=110, warmup_steps=10, lr=1.0, min_lr_ratio=0.1, schedule="cosine")
    from hpcpipe.train.schedule import lr_at

    assert lr_at(1, cfg) == pytest.approx(0.1)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # half-way: mean of peak and floor
    assert lr_at(110, cfg) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_linear_and_constant() -> None:
    from hpcpipe.train.schedule import lr_at

    lin = TrainConfig(steps=20, warmup_steps=0, lr=2.0, min_lr_ratio=0.0, schedule="linear")
    assert lr_at(10, lin) == pytest.approx(1.0)
    const = TrainConfig(steps=20, warmup_steps=5, lr=2.0, schedule="constant")
    assert lr_at(3, const) == pytest.approx(1.2)
    assert lr_at(19, const) == pytest.approx(2.0)


def test_single_process_when_nothing_is_set() -> None:
    env = detect_environment({})
    assert (env.kind, env.rank, env.world_size, env.is_external) == ("single", 0, 1, False)


def test_torchrun_environment() -> None:
    env = detect_environment(
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "n0",
            "MASTER_PORT": "29400",
            "TORCHELASTIC_RUN_ID": "x",
        }
    )
    assert (env.kind, env.rank, env.local_rank, env.world_size, env.local_world_size) == (
        "torchrun",
        3,
        1,
        4,
        2,
    )
    assert env.master_addr == "n0" and env.master_port == 29400
    assert not env.on_one_host  # two nodes: rank 0's store binds where the other node reaches it


def test_kubeflow_pytorchjob_environment() -> None:
    env = detect_environment(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
    )
    assert env.kind == "kubernetes" and env.local_rank == 0 and env.local_world_size == 1
    assert not env.on_one_host


def test_slurm_step_environment() -> None:
    env = detect_environment(
        {
            "SLURM_PROCID": "5",
            "SLURM_LOCALID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_NTASKS": "8",
            "SLURM_STEP_NUM_TASKS": "8",
            "SLURM_TASKS_PER_NODE": "4(x2)",
            "SLURM_JOB_ID": "1234",
            "SLURM_STEP_NODELIST": "gpu[007-008]",
        }
    )
    assert (env.kind, env.rank, env.local_rank, env.world_size, env.local_world_size) == ("slurm", 5, 1, 8, 4)
    assert env.master_port == 20000 + 1234
    assert env.master_addr in {"gpu007"}  # scontrol absent here, or it expands the same way
    assert not env.on_one_host


def test_a_group_on_one_host_meets_on_loopback_and_a_multi_node_one_where_peers_reach_it() -> None:
    from hpcpipe.launch.rendezvous import LOOPBACK_BACKEND, node_address, rendezvous_backend

    def env(world: int, local: int, master: str, nodes: int | None = None) -> DistEnv:
        return DistEnv("torchrun", 0, 0, world, local, master, 29500, nodes)

    assert env(2, 2, "127.0.0.1").on_one_host  # hpcpipe train --nproc 2 (the agent's loopback)
    assert env(2, 2, "node7", nodes=1).on_one_host  # one-node torchrun (GROUP_WORLD_SIZE) or srun
    assert env(2, 1, "127.0.0.1").on_one_host  # two local "nodes" of one elastic job
    assert not env(4, 2, "node7", nodes=2).on_one_host and not env(2, 1, "10.0.0.7").on_one_host
    assert not env(2, 2, "node7").on_one_host  # no word on the node count: never assume one
    for local in ("127.0.0.1:0", "localhost:29400", "[::1]:29400", "127.0.0.2"):
        assert rendezvous_backend(local) == LOOPBACK_BACKEND
    assert rendezvous_backend("head:29400") == rendezvous_backend("10.0.0.1:29400") == "c10d"
    assert node_address("127.0.0.1:0", None) == node_address("localhost:1", None) == "127.0.0.1"
    assert node_address("[::1]:29400", None) == "::1"
    assert node_address("head:29400", None) is None and node_address("head:1", "n2") == "n2"


def test_slurm_batch_script_is_not_a_worker() -> None:
    batch_env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}
    assert detect_environment(batch_env).kind == "single"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("gpu[003-010,12],cpu01", "gpu003"), ("node1,node2", "node1"), ("solo", "solo"), ("a[9]", "a9")],
)
def test_parse_first_host(nodelist: str, first: str) -> None:
    assert _parse_first_host(nodelist) == first


def test_processes_sharing_cores_wait_passively_unless_the_user_chose() -> None:
    from hpcpipe.train.environment import sharing_cores

    assert sharing_cores({"PATH": "/bin"}) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert sharing_cores({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
