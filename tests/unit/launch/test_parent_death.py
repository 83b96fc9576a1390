"""``parent_death.py`` run as a script: the program it execs is SIGKILLed when the process that
started it ends, even when that process is killed outright, and at once when that process ended
before the request could see it. (The agent's use of it, for spawned ranks and for the profiler
a worker runs under, is tested in ``tests/e2e/test_signals_e2e.py`` and ``test_nsight.py``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from tests.helpers import gone_within, process_alive

from hpcpipe.launch.parent_death import command_ending_with_the_parent

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
    pytest.mark.timeout(60),
]

SCRIPT = command_ending_with_the_parent(())[:-1]  # the interpreter, its flags and the file

# A parent that starts a command, prints the child's pid and waits until its stdin closes.
PARENT = """import os, subprocess, sys
child = subprocess.Popen({command!r}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
print(child.pid, flush=True)
os.read(0, 1)
"""


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode().split("\0")[:-1]
    except OSError:
        return []


@contextmanager
def _started_by_a_parent(command: list[str]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A parent process running ``command``: (the parent, the child's pid); both gone after."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(command=command)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = 0
    try:
        child = int(parent.stdout.readline())
        yield parent, child
    finally:
        parent.kill()
        parent.communicate(timeout=10)
        if child and process_alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_program_ends_when_its_parent_is_killed_outright() -> None:
    program = ["sleep", "120"]  # looked up on the PATH, as a profiler's name is
    with _started_by_a_parent(list(command_ending_with_the_parent(tuple(program)))) as (parent, child):
        deadline = time.monotonic() + 20
        while _cmdline(child) != program and time.monotonic() < deadline:  # exec'd: nothing between
            time.sleep(0.02)  # (an exec under way reads as an empty command line)
        assert _cmdline(child) == program
        parent.kill()
        parent.wait(timeout=10)
        assert gone_within(child, 10), "the program outlived its parent"


def test_without_it_the_program_outlives_its_parent() -> None:
    """The control: the same parent starting ``sleep`` directly leaves it running."""
    with _started_by_a_parent(["sleep", "120"]) as (parent, child):
        parent.kill()
        parent.wait(timeout=10)
        time.sleep(0.5)
        assert process_alive(child)


def test_a_starter_that_ended_before_the_request_ends_the_program_at_once() -> None:
    """The starter's pid is not this process's parent: it ended before the request was made (its
    children were handed to another), so the program ends now, before it starts, saying why."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    command = [*SCRIPT, str(gone.pid), "sleep", "120"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert f"process {gone.pid}, which started process" in proc.stderr and "ending too" in proc.stderr
    ours = [*SCRIPT, str(os.getpid()), "true"]  # this process: its starter, still here
    assert subprocess.run(ours, timeout=30, check=False).returncode == 0


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ([], 2, "usage: python parent_death.py PARENT PROGRAM"),
        (["sleep", "1"], 2, "usage: python parent_death.py PARENT PROGRAM"),  # no parent pid
        (["0", "/nonexistent/profiler"], 127, "cannot start '/nonexistent/profiler': No such file"),
    ],
)
def test_bad_arguments_and_a_missing_program_say_so_in_one_line(
    argv: list[str], code: int, says: str
) -> None:
    proc = subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == code
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and says in proc.stderr
