"""Cluster environment detection: who started this process, and what is its rank?

One interface (``DistEnv``), one detector per launcher, a single detection order:
torchrun / Kubernetes PyTorchJob (both export ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``), then a
Kubeflow TrainJob pod started without an agent (``PET_*``: torchrun's settings for the node, and
the Job completion index as the node rank), then Slurm (``srun`` exports
``SLURM_PROCID``/``SLURM_NTASKS``), then a single process.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpcpipe.errors import UserError
from hpcpipe.netutil import is_loopback


@dataclass(frozen=True)
class DistEnv:
    kind: str  # "single" | "torchrun" | "kubernetes" | "slurm"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    nodes: int | None = None  # hosts the launcher says the group spans; None: it does not say

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def on_one_host(self) -> bool:
        """Every rank of this group runs on this machine, so the group can meet on loopback: their
        MASTER_ADDR is a loopback address (hpcpipe's agent, or local "nodes" of one elastic job),
        which no other machine could reach, or the launcher says the group spans one node and
        all its ranks are this node's. Only positive evidence counts: a launcher that leaves the
        local world size out must not make a multi-node group listen on loopback. Each elastic
        round is a new group."""
        if is_loopback(self.master_addr):
            return True
        return self.nodes == 1 and self.world_size == self.local_world_size

    @property
    def is_external(self) -> bool:
        """Started by an outside launcher (torchrun, srun, the Kubeflow operator)."""
        return self.kind != "single"

    def export(self) -> None:
        """Set the variables ``init_process_group(init_method='env://')`` reads."""
        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )


def detect_environment(env: Mapping[str, str] | None = None) -> DistEnv:
    """The first detector that recognises the environment wins."""
    env = os.environ if env is None else env
    detectors: list[Callable[[Mapping[str, str]], DistEnv | None]] = [_torchrun, _trainjob, _slurm]
    for detect in detectors:
        found = detect(env)
        if found is not None:
            return found
    return DistEnv(kind="single", rank=0, local_rank=0, world_size=1, local_world_size=1)


def _torchrun(env: Mapping[str, str]) -> DistEnv | None:
    if not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= env.keys():
        return None
    world = int(env["WORLD_SIZE"])
    # The Kubeflow PyTorchJob operator sets RANK/WORLD_SIZE/MASTER_* but no LOCAL_RANK (one
    # process per pod); torchrun always sets LOCAL_RANK and TORCHELASTIC_RUN_ID.
    kind = "torchrun" if "LOCAL_RANK" in env else "kubernetes"
    return DistEnv(
        kind=kind,
        rank=int(env["RANK"]),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        world_size=world,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1" if kind == "kubernetes" else str(world))),
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
        # torch's elastic agent tells its workers how many agents (nodes) joined the round.
        nodes=int(env["GROUP_WORLD_SIZE"]) if env.get("GROUP_WORLD_SIZE", "").isdigit() else None,
    )


def _trainjob(env: Mapping[str, str]) -> DistEnv | None:
    """One worker per TrainJob pod: node rank from PET_NODE_RANK or the Job completion index."""
    if not {"PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT"} <= env.keys():
        return None
    nproc = env.get("PET_NPROC_PER_NODE", "1")
    if nproc != "1":
        raise UserError(
            f"PET_NPROC_PER_NODE={nproc}: a TrainJob node with several processes needs an agent; "
            "start the pod with `hpcpipe launch agent CONFIG` (what `hpcpipe launch k8s` renders)"
        )
    node_rank = env.get("PET_NODE_RANK", env.get("JOB_COMPLETION_INDEX"))
    if node_rank is None or not env["PET_NNODES"].isdigit():
        raise UserError(
            "PET_NNODES/PET_NODE_RANK: a TrainJob worker needs a fixed node count and its node rank "
            "(PET_NODE_RANK or JOB_COMPLETION_INDEX)"
        )
    return DistEnv(
        kind="kubernetes",
        rank=int(node_rank),
        local_rank=0,
        world_size=int(env["PET_NNODES"]),
        local_world_size=1,
        master_addr=env["PET_MASTER_ADDR"],
        master_port=int(env["PET_MASTER_PORT"]),
        nodes=int(env["PET_NNODES"]),  # one worker per pod, one pod per node
    )


def _slurm(env: Mapping[str, str]) -> DistEnv | None:
    # Only a task started by srun (a job step) is a worker; the batch script itself is not.
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env:
        return None
    world = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))
    if world <= 1:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", "127.0.0.1"))
    job_id = int(env.get("SLURM_JOB_ID", "0"))
    return DistEnv(
        kind="slurm",
        rank=int(env["SLURM_PROCID"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        world_size=world,
        local_world_size=_tasks_on_this_node(env, world),
        master_addr=env.get("MASTER_ADDR", first_host(nodelist)),
        # A port derived from the job id keeps concurrent jobs on one node apart.
        master_port=int(env.get("MASTER_PORT", str(20000 + job_id % 20000))),
        nodes=_slurm_nodes(env),
    )


def _slurm_nodes(env: Mapping[str, str]) -> int | None:
    """The step's node count (a step never spans more nodes than its job has)."""
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return None


def _tasks_on_this_node(env: Mapping[str, str], world: int) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2)" or "3,2"; SLURM_NTASKS_PER_NODE when given.
    if "SLURM_NTASKS_PER_NODE" in env:
        return int(env["SLURM_NTASKS_PER_NODE"])
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))
    match = re.match(r"(\d+)", per_node)
    return int(match.group(1)) if match else world


def node_name(env: Mapping[str, str] | None = None) -> str:
    """This node's name as the scheduler knows it (Slurm's NodeName), else the hostname. They
    differ where several nodes share a kernel hostname (network namespaces, some containers)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def first_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``scontrol show hostnames`` when present, else parsed."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.split()
            if out:
                return out[0]
        except (subprocess.SubprocessError, OSError):
            pass
    return _parse_first_host(nodelist)


def _parse_first_host(nodelist: str) -> str:
    # "gpu[003-010,12],cpu01" -> "gpu003"; "node1,node2" -> "node1"
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if match is None:
        return nodelist
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


# The device nodes of NVIDIA's and AMD's GPU drivers.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")


def gpu_device_present() -> bool:
    """Whether this machine may have a GPU (a driver's device node exists), found without
    initialising CUDA (``torch.cuda.is_available()`` does: no process that forks may call it)."""
    return any(os.path.exists(node) for node in GPU_DEVICE_NODES)


def sharing_cores(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for processes that train side by side on one node's cores (HPO trials of several
    workers, test runners): idle OpenMP threads sleep instead of spinning.

    Each process sizes its thread pool to the whole node; by default libgomp's idle threads spin
    for a while at every parallel region's end, on cores the other processes need. Measured here
    (2 cores): four 10-step HPO trials on two workers took 94 s spinning, 17 s with PASSIVE; one
    process alone trains at the same speed either way. A value the user set is kept.
    """
    return {**env, "OMP_WAIT_POLICY": env.get("OMP_WAIT_POLICY", "PASSIVE")}
