"""Stopped workers that were told to end are continued, so they end now.

A worker stopped by SIGSTOP (a debugger detached badly, ``kill -STOP``, a frozen cgroup, the chaos
suite's stalled rank) cannot act on the SIGTERM that torch's agent sends when it tears a failed
group down: the signal stays pending, and the agent waits its whole shutdown timeout (30 s, or the
preemption grace) before SIGKILL. As systemd does (SIGTERM, then SIGCONT), the agent continues such
a worker: a thread reads each worker's ``/proc/PID/status`` twice a second and sends SIGCONT to one
that is stopped (state ``T``; a traced ``t`` is a debugger's and is left alone) with a signal that
ends it pending. A stopped worker that nobody asked to end stays stopped: the hang watchdog must
still see it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

# Signals that end a worker (or make it checkpoint and end): torch's teardown, preemption, Ctrl-C.
ENDING = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}
)
POLL_S = 0.5


def told_to_end_while_stopped(status: str) -> bool:
    """Whether a ``/proc/PID/status`` text shows a stopped process with an ending signal pending."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if not fields.get("State", "").strip().startswith("T"):
        return False
    pending = 0
    for name in ("SigPnd", "ShdPnd"):  # thread-directed and process-directed pending signals
        with contextlib.suppress(ValueError):
            pending |= int(fields.get(name, "0").strip(), 16)
    return any(pending & (1 << (int(sig) - 1)) for sig in ENDING)


def continue_if_told_to_end(pid: int) -> bool:
    """SIGCONT ``pid`` if it is stopped with an ending signal pending; whether it was sent."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            status = fh.read()
        if told_to_end_while_stopped(status):
            os.kill(pid, signal.SIGCONT)
            return True
    except OSError:  # gone meanwhile
        pass
    return False


@contextlib.contextmanager
def continuing_stopped_workers(workers: Callable[[], list[int]]) -> Iterator[None]:
    """While the block runs, continue any of ``workers()`` that is stopped and told to end."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            for pid in workers():
                continue_if_told_to_end(pid)

    thread = threading.Thread(target=watch, name="hpcpipe-continue-stopped", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
