"""A process group for benchmarks: the trainer's set-up, plus a real one-rank group for one process.

The trainer runs a single process without a process group; a benchmark wants the same code path
(collectives, gathers) at every world size, so a single process joins a one-rank group backed by an
in-memory store instead.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from hpcpipe.config import ParallelConfig
from hpcpipe.launch.environment import DistEnv
from hpcpipe.train.distributed import DistContext, init_distributed, shutdown_distributed


@contextmanager
def bench_group(parallel: ParallelConfig, env: DistEnv) -> Iterator[DistContext]:
    """Join (and afterwards leave) a process group of ``env.world_size`` ranks, one included."""
    import torch.distributed as dist

    ctx = init_distributed(parallel, env)
    try:
        if not ctx.is_distributed:
            backend = _single_backend(parallel, ctx)
            dist.init_process_group(
                backend=backend,
                store=dist.HashStore(),
                rank=0,
                world_size=1,
                timeout=timedelta(seconds=parallel.timeout_s),
            )
            ctx = DistContext(
                rank=0,
                local_rank=0,
                world_size=1,
                local_world_size=1,
                device=ctx.device,
                backend=backend,
            )
        yield ctx
        if env.is_external and ctx.world_size > 1:
            _hand_over_rendezvous(ctx)
    finally:
        shutdown_distributed()


def _hand_over_rendezvous(ctx: DistContext) -> None:
    """Point MASTER_PORT at a fresh port before leaving, for the next group this process joins.

    Under torchrun or srun a verb may join a second group after this one (``accept`` trains a
    job after benchmarking). Re-using the launcher's port races: a rank that leaves first can
    reach rank 0's old store, still up, and read the old group's addresses. Rank 0 picks a free
    port, every rank takes it, and no rank leaves before all have it.
    """
    import torch.distributed as dist

    port: list[object] = [_free_port() if ctx.is_main else None]
    dist.broadcast_object_list(port, src=0)
    os.environ["MASTER_PORT"] = str(port[0])
    dist.barrier()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _single_backend(parallel: ParallelConfig, ctx: DistContext) -> str:
    if parallel.backend != "auto":
        return parallel.backend
    return "nccl" if ctx.device.type == "cuda" else "gloo"
