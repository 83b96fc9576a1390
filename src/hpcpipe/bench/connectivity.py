"""Connectivity of a joined group: who is there (rank, host, device) and rank 0's round trip to each.

Reaching this code already proves every rank joined the group (rendezvous is all-or-nothing); the
point-to-point round trips then show that rank 0 can exchange data with every rank individually,
which a collective hides (a ring passes through each link once, a broken pair stalls all ranks
without naming the pair).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING, Any

from hpcpipe.train.environment import node_name

if TYPE_CHECKING:
    from hpcpipe.train.distributed import DistContext

PING_ROUNDS = 5


def run_connectivity(ctx: DistContext, rounds: int = PING_ROUNDS) -> dict[str, Any] | None:
    """Every rank's identity and rank 0's median round-trip time to it; rank 0 returns the result."""
    import torch.distributed as dist

    me = {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "host": node_name(),
        "pid": os.getpid(),
        "device": str(ctx.device),
        "device_name": _device_name(ctx),
    }
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, me)
    rtts = _ping_all(ctx, rounds)
    if not ctx.is_main:
        return None
    for info in gathered:
        info["rtt_ms"] = rtts.get(info["rank"])
    return {
        "world_size": ctx.world_size,
        "backend": dist.get_backend(),
        "hosts": sorted({info["host"] for info in gathered}),
        "ranks": gathered,
    }


def _ping_all(ctx: DistContext, rounds: int) -> dict[int, float]:
    """Rank 0 sends a small tensor to each rank in turn and waits for it to come back."""
    import torch
    import torch.distributed as dist

    token = torch.zeros(1, device=ctx.device)
    rtts: dict[int, float] = {}
    for peer in range(1, ctx.world_size):
        if ctx.rank == 0:
            samples = []
            for i in range(rounds + 1):  # the first round sets up the pair's connection
                start = time.perf_counter()
                dist.send(token, dst=peer)
                dist.recv(token, src=peer)
                _sync(ctx)
                if i > 0:
                    samples.append((time.perf_counter() - start) * 1e3)
            rtts[peer] = statistics.median(samples)
        elif ctx.rank == peer:
            for _ in range(rounds + 1):
                dist.recv(token, src=0)
                dist.send(token, dst=0)
    return rtts


def _sync(ctx: DistContext) -> None:
    if ctx.device.type == "cuda":
        import torch

        torch.cuda.synchronize(ctx.device)


def _device_name(ctx: DistContext) -> str:
    if ctx.device.type == "cuda":
        import torch

        return str(torch.cuda.get_device_name(ctx.device))
    return "cpu"
