"""Processes that end when their parent ends, even when it is killed outright (Linux).

A launcher killed by SIGKILL (by hand, by the OOM killer) runs no code of its own, so nothing it
would do at exit reaches its workers: each must ask Linux itself for SIGKILL when its parent goes
(``PR_SET_PDEATHSIG``), as a lost node's processes end. Forked workers ask first thing
(``fork_server``). A program that torch's agent starts (a worker under ``parallel.worker_start:
spawn``, or the profiler a worker runs under, ``observe.profile.tool: nsys | ncu``) is started
through this file run as a script: ``python -s -S -P parent_death.py PARENT PROGRAM ARGS...``
asks for the signal and then *execs* PROGRAM, which keeps the request, so the program itself is
the process that asked, with nothing in between. (Linux clears the request in a forked child and
when a set-user-ID, set-group-ID or file-capability program is exec'd, or credentials change.)

Linux sends the signal when the *thread* that started the process ends: torch's agent starts and
restarts workers from the thread that runs it (the launcher's main thread), which lives until the
workers end. A parent that ends before the request is made cannot be seen by it: the process
compares its parent with PARENT, the pid of the process that started it (0: whichever parent it
finds first thing), and ends at once, saying so, if that one has gone. This file imports the
standard library only and needs no site packages, so it starts in about 10 ms.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import NoReturn

__all__ = ["command_ending_with_the_parent", "die_with_the_parent", "exec_ending_with_the_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_the_parent(parent: int | None = None) -> None:
    """Ask for SIGKILL when this process's parent ends. ``parent``: the pid of the process that
    started this one, where known; if it is no longer the parent (it ended before the request),
    this process ends now. Where the request is refused (a sandbox that forbids ``prctl``) the
    process goes on without it, saying so in one line on stderr; elsewhere than Linux, silently."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid() if parent is None else parent
    refused = "no prctl in this libc"
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL)) == 0
        refused = "" if done else os.strerror(ctypes.get_errno())
    if refused:
        _say(f"PR_SET_PDEATHSIG refused ({refused}): process {os.getpid()} will not end with {parent}")
    elif os.getppid() != parent:  # the parent ended before the request could see it end
        _say(f"process {parent}, which started process {os.getpid()}, has ended: ending too")
        os.kill(os.getpid(), signal.SIGKILL)


def _say(line: str) -> None:
    print(f"hpcpipe: {line}", file=sys.stderr, flush=True)


def command_ending_with_the_parent(command: tuple[str, ...], parent: int | None = None) -> tuple[str, ...]:
    """``command`` started through this file: it is SIGKILLed when the process that starts it
    ends. ``parent``: that process's pid, where the caller knows it (``os.getpid()`` when the
    caller starts it). ``-s -S -P``: no site packages, no script folder on the path (this file's
    folder holds modules of hpcpipe's), and the environment (``PYTHONHOME``) as it is."""
    script = (sys.executable, "-s", "-S", "-P", os.path.abspath(__file__))
    return (*script, str(parent or 0), *command)


def exec_ending_with_the_parent(argv: list[str]) -> NoReturn:
    """``PARENT PROGRAM [ARGS...]``: this process becomes PROGRAM (looked up on the PATH), asking
    first for SIGKILL when its parent ends. PARENT: the starter's pid, or 0 for unknown."""
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python parent_death.py PARENT PROGRAM [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    parent, command = int(argv[0]), argv[1:]
    die_with_the_parent(parent or None)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        _say(f"cannot start {command[0]!r}: {exc.strerror}")
        raise SystemExit(127) from None


if __name__ == "__main__":
    exec_ending_with_the_parent(sys.argv[1:])
