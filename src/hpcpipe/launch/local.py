"""Start N local workers through the node agent (torch.distributed's elastic agent, as torchrun).

The workers run ``python -m <module> <args>``; the agent gives each the torchrun environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), restarts the group up to ``max_restarts``
times when a worker dies, and reports failures.
"""

from __future__ import annotations

import uuid
from typing import Literal

from hpcpipe.launch.agent import AgentSpec, run_agent


def launch_local(
    module: str,
    args: list[str],
    nproc: int,
    max_restarts: int = 0,
    run_id: str | None = None,
    monitor_interval_s: float = 0.1,
    start_method: Literal["forkserver", "spawn"] = "forkserver",
    preload: tuple[str, ...] = (),
    wrapper: tuple[str, ...] = (),
    events_dir: str | None = None,
    grace_s: float = 60.0,
    preempt_exit_code: int = 75,
) -> int:
    """Run ``module``'s worker on ``nproc`` local ranks with ``args``; returns the group's exit code.

    Exit code: 0 when every rank succeeded; otherwise the first failed rank's code (so a
    worker's UserError exit 2 stays 2). ``wrapper``: a profiler the workers start under.
    ``events_dir``: the run directory whose events.jsonl records each restart's milestones.
    ``grace_s``: how long the workers get to checkpoint after SIGTERM/SIGUSR1 before they are
    SIGKILLed; ``preempt_exit_code``: what they exit with once they did.
    """
    spec = AgentSpec(
        nproc_per_node=nproc,
        rdzv_endpoint="127.0.0.1:0",
        rdzv_id=run_id or f"hpcpipe-{uuid.uuid4().hex[:8]}",
        max_restarts=max_restarts,
        monitor_interval_s=monitor_interval_s,
        start_method=start_method,
        preload=preload,
        wrapper=wrapper,
        events_dir=events_dir,
        grace_s=grace_s,
        preempt_exit_code=preempt_exit_code,
    )
    return run_agent(spec, module, args)
