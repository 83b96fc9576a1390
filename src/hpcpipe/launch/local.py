"""Start N local workers through torch.distributed's elastic agent (what torchrun uses).

The workers run ``python -m <module> <args>``; the agent gives each the torchrun environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), restarts the group up to ``max_restarts``
times when a worker dies, and reports failures.
"""

from __future__ import annotations

import os
import sys
import uuid


def launch_local(
    module: str,
    args: list[str],
    nproc: int,
    max_restarts: int = 0,
    run_id: str | None = None,
    monitor_interval_s: float = 0.5,
) -> int:
    """Run ``python -m module args`` on ``nproc`` local ranks; returns the group's exit code.

    Exit code: 0 when every rank succeeded; otherwise the first failed rank's code (so a
    worker's UserError exit 2 stays 2).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Restarts on one host are flaky when the agent shares its rendezvous TCP store with the
    # workers; a separate store per round is reliable.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=run_id or f"hpcpipe-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=max_restarts,
        monitor_interval=monitor_interval_s,
        start_method="spawn",
    )
    try:
        elastic_launch(config, sys.executable)("-u", "-m", module, *args)
    except ChildFailedError as exc:
        codes = [failure.exitcode for _, failure in sorted(exc.failures.items())]
        return next((code for code in codes if code > 0), 1)
    return 0
