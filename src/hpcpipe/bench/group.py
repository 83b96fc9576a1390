"""A process group for benchmarks, joined so that another group can follow it in the same process.

Three differences from the trainer's group (``hpcpipe.train.distributed``):

- one process joins a real one-rank group (an in-memory store), so collectives and gathers run the
  same code at every world size;
- under torchrun or srun a verb can join a second group after this one (``accept`` benchmarks,
  then trains). Both would meet in the launcher's store under the same key names, and a rank
  that arrives early at the second group could read the first group's stale addresses. This
  group's keys therefore live under their own prefix, and where rank 0 itself hosts the store
  (srun, Kubeflow: no torchrun agent), ``MASTER_PORT`` is moved to a fresh port on leaving, so
  the next group starts a new store instead of meeting in the old one;
- a process that joined a multi-rank group leaves through :func:`exit_process` (gloo can abort
  at interpreter exit after ``destroy_process_group``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

from hpcpipe.config import ParallelConfig
from hpcpipe.netutil import free_port
from hpcpipe.train.distributed import DistContext, group_store, init_distributed, shutdown_distributed
from hpcpipe.train.environment import DistEnv

# Set once this process was a rank of a multi-rank group (an Event: a flag without `global`).
_joined_multi_rank_group = threading.Event()


@contextmanager
def bench_group(parallel: ParallelConfig, env: DistEnv) -> Iterator[DistContext]:
    """Join (and afterwards leave) a process group of ``env.world_size`` ranks, one included."""
    import torch.distributed as dist

    # Device and intra-op threads as the trainer picks them; the group itself is joined below.
    local = init_distributed(parallel, replace(env, world_size=1))
    backend = (
        parallel.backend if parallel.backend != "auto" else "nccl" if local.device.type == "cuda" else "gloo"
    )
    timeout = timedelta(seconds=parallel.timeout_s)
    dist.init_process_group(
        backend=backend,
        store=_store(env, timeout),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=local.device if local.device.type == "cuda" else None,
    )
    if env.world_size > 1:
        _joined_multi_rank_group.set()
    ctx = replace(local, world_size=env.world_size, backend=backend)
    try:
        yield ctx
        if env.is_external and ctx.world_size > 1 and not _agent_hosts_store():
            _move_master_port(ctx)
    finally:
        shutdown_distributed()


def _store(env: DistEnv, timeout: timedelta) -> Any:
    import torch.distributed as dist

    if env.world_size == 1:
        return dist.HashStore()
    env.export()
    store = group_store(env, timeout)  # env://'s store, on loopback when every rank runs here
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun's store outlives restarts
    return dist.PrefixStore(f"hpcpipe-bench/{attempt}", store)


def _agent_hosts_store() -> bool:
    """torchrun's agent hosts the store at MASTER_PORT for the whole job: it must not move."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _move_master_port(ctx: DistContext) -> None:
    """Rank 0 picks a free port for the next group; every rank takes it before anyone leaves."""
    import torch.distributed as dist

    port: list[object] = [free_port("") if ctx.is_main else None]
    dist.broadcast_object_list(port, src=0)
    os.environ["MASTER_PORT"] = str(port[0])
    dist.barrier()


def exit_process(code: int) -> None:
    """Exit now through os._exit after flushing when this process was a rank of a group; else return."""
    if _joined_multi_rank_group.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
