"""A worker under a profiler ends when its launcher ends, whatever the profiler does (Linux).

Under ``observe.profile.tool: nsys | ncu`` the worker is the tool's child, not the launcher's, so
the parent-death request (``parent_death.py``) would tie it to the tool: to whichever of the
tool's threads started it, and to the tool's own end, which may come early (a tool that ends on
the SIGUSR1 forwarded for a preemption while its worker checkpoints; ``--kill none``). Instead
the launcher names itself in the workers' environment (``HPCPIPE_LAUNCHER``: its pid and start
time, so a pid used again is not taken for it) and each worker's ``main`` watches that process:
a daemon thread waits on a pidfd (no polling) and SIGKILLs the worker when the launcher is gone,
as a lost node's processes end. The tool itself is started through ``parent_death.py`` and ends
with the launcher too.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import MutableMapping
from typing import NoReturn

__all__ = ["LAUNCHER_VAR", "launcher_identity", "start_ticks", "watch_the_launcher"]

LAUNCHER_VAR = "HPCPIPE_LAUNCHER"


def launcher_identity(pid: int | None = None) -> str:
    """``PID:START`` for this process (or ``pid``): what ``LAUNCHER_VAR`` holds."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_ticks(pid)}"


def start_ticks(pid: int | str = "self") -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22: what
    tells a process from a later one given the same pid); None once it is gone, or without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def watch_the_launcher(env: MutableMapping[str, str] = os.environ) -> bool:
    """When ``env`` names a launcher (removed from it: not handed on to what this worker starts),
    end this process by SIGKILL when that launcher ends; at once if it already has. True while
    watching. Where a pidfd cannot be had (Linux before 5.3), the worker says so in one line and
    goes on unwatched."""
    named = env.pop(LAUNCHER_VAR, "")
    pid_text, _, start = named.partition(":")
    if not (pid_text.isdigit() and sys.platform.startswith("linux")):
        return False
    pid = int(pid_text)
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        _end(f"launcher {pid} has ended")
    except (OSError, AttributeError) as exc:
        print(
            f"hpcpipe: cannot watch launcher {pid} ({exc}): this worker will not end with it", file=sys.stderr
        )
        return False
    if str(start_ticks(pid)) != start:  # the pidfd is another process's, one that took the pid since
        _end(f"launcher {pid} has ended")
    threading.Thread(
        target=_end_when_readable, args=(pidfd, pid), name="hpcpipe-launcher-watch", daemon=True
    ).start()
    return True


def _end_when_readable(pidfd: int, pid: int) -> None:
    select.select([pidfd], [], [])  # a pidfd turns readable when its process has exited
    _end(f"launcher {pid} has ended")


def _end(why: str) -> NoReturn:
    print(f"hpcpipe: {why}: ending worker {os.getpid()}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(128 + signal.SIGKILL)  # not reached: SIGKILL cannot be caught
