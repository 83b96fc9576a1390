"""Processes that end when their parent ends, even when it is killed outright (Linux).

A launcher killed by SIGKILL (by hand, by the OOM killer) runs no code of its own, so nothing it
would do at exit reaches its workers: each worker must ask Linux itself for a signal when its
parent goes (``PR_SET_PDEATHSIG``). Forked workers ask first thing (``fork_server``). A worker
that torch's agent starts as a new program (``parallel.worker_start: spawn``, or a worker under a
profiler, ``observe.profile.tool: nsys | ncu``) is started through this file run as a script:
``python -I -S parent_death.py SIGNUM PARENT PROGRAM ARGS...`` asks for signal SIGNUM at its
parent's death and then *execs* PROGRAM, which keeps the request (Linux keeps it across ``execve``, except
for set-user-ID programs), so the worker, or the profiler, is the process that asks, with nothing
in between. A profiler's own child, the worker, is started the same way again, so the chain ends
link by link: launcher, tool, worker.

Linux sends the signal when the *thread* that started the process ends; torch's agent starts
workers from the thread that runs it, which lives until the workers end. A parent that ends
before the request is made cannot be seen by the request: the process compares its parent with
the one it was started by (PARENT, when the starter knows its pid; otherwise the parent it finds
first thing) and, if that one has gone, signals itself. This file imports the
standard library only: as a script it starts in about 15 ms (``-S``: no site packages).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import NoReturn

__all__ = ["die_with_the_parent", "ending_with_the_parent", "exec_ending_with_the_parent"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_the_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask for ``signum`` when this process's parent ends; False where that cannot be had (not
    Linux, or a sandbox that refuses ``prctl``: the process then goes on without it, saying so
    once on stderr). ``parent``: the pid of the process that started this one, where known; when
    it is no longer the parent after the request (it ended before), the signal is sent now."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid() if parent is None else parent
    refused = "no prctl in this libc"
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signum)) == 0
        refused = "" if done else os.strerror(ctypes.get_errno())
    if refused:
        print(
            f"hpcpipe: PR_SET_PDEATHSIG refused ({refused}): process {os.getpid()} will not end "
            "when its launcher is killed outright",
            file=sys.stderr,
            flush=True,
        )
        return False
    if os.getppid() != parent:  # the parent ended before the request could see it end
        os.kill(os.getpid(), signum)
    return True


def ending_with_the_parent(
    command: tuple[str, ...], signum: int = signal.SIGKILL, parent: int | None = None
) -> tuple[str, ...]:
    """``command`` started through this file: it gets ``signum`` when the process that starts it
    ends. ``parent``: that process's pid, where the caller knows it (``os.getpid()`` when this
    process starts it)."""
    script = (sys.executable, "-I", "-S", os.path.abspath(__file__))
    return (*script, str(int(signum)), str(parent or 0), *command)


def exec_ending_with_the_parent(argv: list[str]) -> NoReturn:
    """``SIGNUM PARENT PROGRAM [ARGS...]``: this process becomes PROGRAM (looked up on the PATH),
    asking first for SIGNUM when its parent ends. PARENT: the starter's pid, or 0 for unknown."""
    if len(argv) < 3 or not (argv[0].isdigit() and argv[1].isdigit()):
        print("usage: python parent_death.py SIGNUM PARENT PROGRAM [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    signum, parent, command = int(argv[0]), int(argv[1]), argv[2:]
    die_with_the_parent(signum, parent or None)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"hpcpipe: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(127) from None


if __name__ == "__main__":
    exec_ending_with_the_parent(sys.argv[1:])
