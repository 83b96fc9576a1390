"""A stopped worker that was told to end is continued (``launch/stopped.py``): a SIGSTOPped rank
ends on the agent's SIGTERM at once instead of at the shutdown timeout's SIGKILL; a stopped worker
nobody asked to end stays stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from hpcpipe.launch.stopped import continuing_stopped_workers, told_to_end_while_stopped

pytestmark = pytest.mark.timeout(60)


def _status(state: str, shd: int = 0, sig: int = 0) -> str:
    return f"Name:\tpython\nState:\t{state}\nSigPnd:\t{sig:016x}\nShdPnd:\t{shd:016x}\n"


def test_a_stopped_process_with_sigterm_pending_is_told_to_end() -> None:
    term = 1 << (signal.SIGTERM - 1)
    assert told_to_end_while_stopped(_status("T (stopped)", shd=term))
    assert told_to_end_while_stopped(_status("T (stopped)", sig=1 << (signal.SIGUSR1 - 1)))
    assert not told_to_end_while_stopped(_status("T (stopped)"))  # stopped, nobody asked: stays
    assert not told_to_end_while_stopped(_status("S (sleeping)", shd=term))  # it will act itself
    assert not told_to_end_while_stopped(_status("t (tracing stop)", shd=term))  # a debugger's
    assert not told_to_end_while_stopped(_status("T (stopped)", shd=1 << (signal.SIGCHLD - 1)))


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/status") as fh:
        return next(line.split()[1] for line in fh if line.startswith("State:"))


def test_a_sigstopped_child_ends_on_sigterm_while_watched() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with continuing_stopped_workers(lambda: [child.pid]):
            child.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 5
            while _state(child.pid) != "T" and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.2)  # two polls: a stopped worker nobody told to end stays stopped
            assert _state(child.pid) == "T"
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=10) == -signal.SIGTERM  # without the watch: stopped forever
    finally:
        child.kill()
        child.wait()
