"""``parent_death.py`` run as a script: the program it execs gets the signal asked for when the
process that started it ends, even when that process is killed outright, and at once when that
process ended before the request could see it. (The agent's use of it, for spawned ranks and for
the profiler and worker under it, is tested in ``tests/e2e/test_signals_e2e.py`` and
``test_nsight.py``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hpcpipe.launch.parent_death import ending_with_the_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

SCRIPT = ending_with_the_parent(())[:-2]  # the interpreter, its flags and the file

# A parent that starts a command, prints the child's pid and waits to be killed.
PARENT = """import subprocess, sys, time
child = subprocess.Popen({command!r})
print(child.pid, flush=True)
time.sleep(120)
"""


def _state(pid: int) -> str | None:
    """The process's state letter; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode().split("\0")[:-1]
    except OSError:
        return []


def _started_by_a_parent(command: list[str]) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(command=command)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _state(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    return _state(pid) in (None, "Z")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_program_ends_when_its_parent_is_killed_outright(signum: signal.Signals) -> None:
    program = ["sleep", "120"]  # looked up on the PATH, as a profiler's name is
    parent, child = _started_by_a_parent(list(ending_with_the_parent(tuple(program), signum)))
    deadline = time.monotonic() + 20
    while _cmdline(child) != program and time.monotonic() < deadline:  # exec'd: nothing in between
        time.sleep(0.02)  # (an exec under way reads as an empty command line)
    became = _cmdline(child)
    parent.kill()
    parent.wait(timeout=10)
    ended = _gone_within(child, 10)
    if not ended:
        os.kill(child, signal.SIGKILL)
    assert became == program
    assert ended, "the program outlived its parent"


@pytest.mark.timeout(60)
def test_without_it_the_program_outlives_its_parent() -> None:
    """The control: the same parent starting ``sleep`` directly leaves it running."""
    parent, child = _started_by_a_parent(["sleep", "120"])
    parent.kill()
    parent.wait(timeout=10)
    time.sleep(0.5)
    try:
        assert _state(child) not in (None, "Z")
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_parent_that_ended_before_the_request_ends_the_program_at_once() -> None:
    """The starter's pid is not this process's parent: it ended before the request was made (its
    children were handed to another), so the signal comes now, before the program starts."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    command = [*SCRIPT, str(int(signal.SIGTERM)), str(gone.pid), "sleep", "120"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == -signal.SIGTERM
    ours = [*SCRIPT, str(int(signal.SIGTERM)), str(os.getpid()), "true"]  # this process: still here
    assert subprocess.run(ours, timeout=30, check=False).returncode == 0


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ([], 2, "usage: python parent_death.py SIGNUM PARENT PROGRAM"),
        (["9", "sleep", "1"], 2, "usage: python parent_death.py SIGNUM PARENT PROGRAM"),  # no parent
        (["9", "0", "/nonexistent/profiler"], 127, "cannot start '/nonexistent/profiler': No such file"),
    ],
)
def test_bad_arguments_and_a_missing_program_say_so_in_one_line(
    argv: list[str], code: int, says: str
) -> None:
    proc = subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == code
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and says in proc.stderr
