"""The node agent (hpcpipe.launch.agent): preemption forwarded to the workers and their exit code
kept, here on one host with 2 gloo ranks (the Slurm integration tests cover two nodes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import tiny_job_sets

from hpcpipe.launch.agent import AgentSpec, _rdzv_configs
from hpcpipe.netutil import free_port
from hpcpipe.observe.metrics import read_events, read_metrics
from hpcpipe.train.preempt import PREEMPT_EXIT_CODE

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def test_usr1_to_the_launcher_is_forwarded_and_the_workers_code_75_comes_back(tmp_path: Path) -> None:
    """torchrun's agent dies of SIGUSR1; hpcpipe's passes it on and exits with the workers' 75."""
    sets = tiny_job_sets(tmp_path, "usr1", "parallel.strategy=ddp")
    argv = [
        sys.executable,
        "-m",
        "hpcpipe",
        "train",
        "tiny",
        "--nproc",
        "2",
        *sets,
        "--set",
        "train.steps=3000",
    ]
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    }
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not [r for r in read_metrics(tmp_path / "usr1") if "loss" in r]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == PREEMPT_EXIT_CODE, err[-3000:]
    assert "preempted" in err
    events = [e["event"] for e in read_events(tmp_path / "usr1")]
    assert "preempted" in events and "run_finished" not in events


def test_the_node_whose_address_is_the_endpoint_hosts_the_store() -> None:
    def spec(local: str | None) -> AgentSpec:
        return AgentSpec(nproc_per_node=2, rdzv_endpoint="n1:29400", local_addr=local)

    assert _rdzv_configs(spec("n1"))["is_host"] is True
    assert _rdzv_configs(spec("n2"))["is_host"] is False
    assert "is_host" not in _rdzv_configs(spec(None))  # torch matches the hostname itself


def test_the_agent_runs_a_trainjob_pod_from_pet_variables(tmp_path: Path) -> None:
    """What a rendered TrainJob pod runs: `hpcpipe launch agent CONFIG --rdzv-id NAME`, with only
    the operator's PET_* variables saying how many nodes and processes, and where the master is."""

    from tests.helpers import run_cli

    from hpcpipe.config import load_config

    sets = tiny_job_sets(tmp_path, "pod", "parallel.strategy=ddp", "train.steps=4")
    overrides = [value for flag, value in zip(sets[::2], sets[1::2], strict=True) if flag == "--set"]
    config = tmp_path / "config.yaml"
    config.write_text(load_config("tiny", overrides).to_yaml())
    port = free_port()
    pet = {
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }
    result = run_cli("launch", "agent", str(config), "--rdzv-id", "pod", cwd=tmp_path, env=pet, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    starts = [e for e in read_events(tmp_path / "pod") if e["event"] == "group_start"]
    assert starts and starts[0]["world_size"] == 2
    assert [r["step"] for r in read_metrics(tmp_path / "pod") if "loss" in r] == [1, 2, 3, 4]
