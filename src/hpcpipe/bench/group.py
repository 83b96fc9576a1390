"""A process group for benchmarks: the trainer's set-up, plus a real one-rank group for one process.

The trainer runs a single process without a process group; a benchmark wants the same code path
(collectives, gathers) at every world size, so a single process joins a one-rank group backed by an
in-memory store instead.
"""

from __future__ import annotations

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
    finally:
        shutdown_distributed()


def _single_backend(parallel: ParallelConfig, ctx: DistContext) -> str:
    if parallel.backend != "auto":
        return parallel.backend
    return "nccl" if ctx.device.type == "cuda" else "gloo"
