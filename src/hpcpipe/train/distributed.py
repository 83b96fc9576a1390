"""Process-group set-up and teardown for every rank, whatever started it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hpcpipe.config import ParallelConfig
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

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of a tensor over ranks (SUM then divide: gloo has no AVG)."""
        value = value.detach().clone()
        if self.is_distributed:
            dist.all_reduce(value)
            value /= self.world_size
        return value

    def sum_over_ranks(self, counts: dict[str, torch.Tensor]) -> dict[str, float]:
        """Each count summed over ranks, in one all-reduce (every rank passes the same keys)."""
        if not counts:
            return {}
        keys = sorted(counts)
        values = torch.stack([counts[k].detach().double().reshape(()) for k in keys])
        if self.is_distributed:
            dist.all_reduce(values)
        return dict(zip(keys, values.tolist(), strict=True))

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()


def init_distributed(cfg: ParallelConfig, env: DistEnv) -> DistContext:
    """Pick the device, set intra-op threads and join the process group (when world > 1)."""
    device = _pick_device(env.local_rank)
    if cfg.strategy == "deepspeed" and device.type == "cpu":
        # Before anything imports DeepSpeed (transformers and peft may): it would pick CUDA
        # because torch was built with it. Read once, at DeepSpeed's import.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    threads = cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // env.local_world_size)
    torch.set_num_threads(threads)
    if cfg.retain_host_memory:
        retain_freed_host_memory()
    backend = None
    if env.is_distributed:
        _joined.append(True)
        backend = _pick_backend(cfg, device)
        env.export()
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=cfg.timeout_s),
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
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if device.type == "cuda" else "gloo"
