"""Process-group set-up and teardown for every rank, whatever started it."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.compat import loopback_tcp_store
from hpcpipe.config import ParallelConfig
from hpcpipe.errors import ConfigError
from hpcpipe.netutil import loopback_bind_address, loopback_interface
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.host_memory import retain_freed_host_memory

_joined: list[bool] = []  # non-empty once this process joined a process group


def joined_a_group() -> bool:
    """Whether this process ever joined a process group (its exit then needs care: see worker)."""
    return bool(_joined)


@dataclass(frozen=True)
class DistContext:
    """What a rank knows about the group it belongs to."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None: no process group (a single process)
    # The data-parallel group this rank belongs to (None: the world). Under tensor parallelism
    # (train/mesh.py) the tp ranks of one group see the same data and hold the same loss: metrics
    # and counts are reduced over the data-parallel ranks only.
    dp_group: Any = None
    dp_size_: int | None = None

    @property
    def dp_size(self) -> int:
        return self.world_size if self.dp_size_ is None else self.dp_size_

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of a tensor over ranks (SUM then divide: gloo has no AVG)."""
        value = value.detach().clone()
        if self.is_distributed and self.dp_size > 1:
            dist.all_reduce(value, group=self.dp_group)
            value /= self.dp_size
        return value

    def sum_over_ranks(self, counts: dict[str, torch.Tensor]) -> dict[str, float]:
        """Each count summed over ranks, in one all-reduce (every rank passes the same keys)."""
        if not counts:
            return {}
        keys = sorted(counts)
        values = torch.stack([counts[k].detach().double().reshape(()) for k in keys])
        if self.is_distributed and self.dp_size > 1:
            dist.all_reduce(values, group=self.dp_group)
        return dict(zip(keys, values.tolist(), strict=True))

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()


def intra_op_threads(cfg: ParallelConfig, env: DistEnv) -> int:
    """torch's intra-op threads for this rank: ``parallel.threads_per_rank``, else an
    ``OMP_NUM_THREADS`` the launcher or the user set (Slurm's ``cpus_per_task`` share, torchrun's
    1), else this process's usable cores (its CPU affinity, not the machine's count: a Slurm step
    or a container may hold fewer) shared by the node's ranks."""
    if cfg.threads_per_rank:
        return cfg.threads_per_rank
    told = os.environ.get("OMP_NUM_THREADS", "").strip()
    if told.isdigit() and int(told) > 0:
        return int(told)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // env.local_world_size)


def init_distributed(cfg: ParallelConfig, env: DistEnv) -> DistContext:
    """Pick the device, set intra-op threads and join the process group (when world > 1)."""
    device = _pick_device(env.local_rank)
    if cfg.strategy == "deepspeed" and device.type == "cpu":
        # Before anything imports DeepSpeed (transformers and peft may): it would pick CUDA
        # because torch was built with it. Read once, at DeepSpeed's import.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(intra_op_threads(cfg, env))
    if cfg.retain_host_memory:
        retain_freed_host_memory()
    backend = None
    if env.is_distributed:
        _joined.append(True)
        backend = _pick_backend(cfg, device)
        env.export()
        timeout = timedelta(seconds=cfg.timeout_s)
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore("default_pg", group_store(env, timeout)),  # as env:// prefixes it
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
    return DistContext(
        rank=env.rank,
        local_rank=env.local_rank,
        world_size=env.world_size,
        local_world_size=env.local_world_size,
        device=device,
        backend=backend,
    )


def group_store(env: DistEnv, timeout: timedelta) -> dist.Store:
    """The key-value store a group of ``env.world_size`` ranks meets in, as ``env://`` finds it
    (``env.export()`` first): rank 0 hosts it at MASTER_ADDR:MASTER_PORT, unless torch's agent
    hosts it for the whole job (torchrun's default; ``TORCHELASTIC_USE_AGENT_STORE``).

    A group whose ranks all run here (``env.on_one_host``) listens on loopback only: rank 0's
    store binds the loopback address (torch's own binds every interface) and the others connect
    there, and gloo and NCCL open their sockets on the loopback interface. Otherwise torch
    decides, and binds where the other nodes reach it."""
    if env.on_one_host:
        _sockets_on_loopback()
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
            host = loopback_bind_address(env.master_addr)
            if env.rank != 0:
                return dist.TCPStore(host, env.master_port, env.world_size, False, timeout)
            try:
                return loopback_tcp_store(host, env.master_port, env.world_size, timeout, multi_tenant=True)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                # The port is taken, maybe by a store this process still serves (an earlier group
                # in it): torch's multi-tenant store hands that one out, and fails as before if not.
    store, _, _ = next(dist.rendezvous("env://", rank=env.rank, world_size=env.world_size, timeout=timeout))
    store.set_timeout(timeout)
    return store


def _sockets_on_loopback() -> None:
    """gloo's and NCCL's own sockets (gloo's pair listeners; NCCL's bootstrap and proxy) on the
    loopback interface; a value the user set is replaced too. By default each takes the address
    the host name resolves to, or the first non-loopback interface."""
    interface = loopback_interface()
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _pick_backend(cfg: ParallelConfig, device: torch.device) -> str:
    if cfg.backend == "nccl" and device.type != "cuda":
        raise ConfigError("parallel.backend=nccl needs CUDA GPUs and this rank has none; use auto or gloo")
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if device.type == "cuda" else "gloo"
