"""The split an out-of-memory error the ranks could not recover from in-process leaves for the
elastic agent's restart.

An OOM inside a collective (DDP's last backward, any FSDP2 backward: ``train/oom.py``) ends the
worker; the agent restarts every rank from the last checkpoint, whose split is the one that ran
out of memory, so each restart ran out of memory again until ``--max-restarts`` was spent. The
rank that ran out of memory writes the halved split (``<run_dir>/oom_restart_split.json``) before
it exits, or, where the micro-batch cannot be halved, ends with the ConfigError naming
``train.micro_batch_size`` (exit 2: the agent does not restart a user error). At the restart,
after the checkpoint's split is restored, every rank reads the file where its node has one and
the ranks agree on the most halvings any of them read (the file is on one node's disk when the
run directory is not shared); the file is then removed. A split the config has changed since is
not taken: the user chose another one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcpipe.fsutil import write_text_replacing
from hpcpipe.train.oom import AllReduceMax, OOMGuard, agree_any


def remember_halved_split(guard: OOMGuard, path: Path) -> None:
    """Write the halved split for the restart; ConfigError when it cannot be halved."""
    configured = list(guard.configured)
    micro, accum = guard.shrink()
    record = {"configured": configured, "micro_batch_size": micro, "accum_steps": accum}
    write_text_replacing(path, json.dumps(record) + "\n")


def take_remembered_split(
    guard: OOMGuard, path: Path, all_reduce_max: AllReduceMax | None
) -> dict[str, Any] | None:
    """Every rank, at the start: apply the halvings the ranks agree on; the event's fields, or
    None when no rank read any (collective: one all-reduce)."""
    halvings = agree_any(_halvings(guard, path), all_reduce_max)
    path.unlink(missing_ok=True)
    factor = 2**halvings
    if not halvings or guard.micro_batch_size % factor:
        return None
    old = (guard.micro_batch_size, guard.accum_steps)
    guard.micro_batch_size, guard.accum_steps = old[0] // factor, old[1] * factor
    return {
        "old_micro_batch_size": old[0],
        "old_accum_steps": old[1],
        "new_micro_batch_size": guard.micro_batch_size,
        "new_accum_steps": guard.accum_steps,
    }


def _halvings(guard: OOMGuard, path: Path) -> int:
    """How many halvings of this run's split the file asks for (0: none, or not for this run)."""
    try:
        record = json.loads(path.read_text())
        micro, accum = int(record["micro_batch_size"]), int(record["accum_steps"])
        configured = tuple(record["configured"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    current = guard.micro_batch_size
    if configured != guard.configured or micro * accum != current * guard.accum_steps or micro < 1:
        return 0
    halvings = 0
    while current > micro and current % 2 == 0:
        current, halvings = current // 2, halvings + 1
    return halvings if current == micro else 0
