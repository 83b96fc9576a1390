"""The cyclic garbage collector while a process imports its libraries, and after.

torch, its compiler stack and the trainer leave ~360,000 long-lived objects behind their imports.
With CPython's default thresholds (700, 10, 10) the collector rescans the whole growing heap about
twenty times on the way, and every full collection after it rescans it again (0.38 s each on the
project's AVX2 machine, 2026-12-02). Measured there with ``perf``: 22% of a launcher's CPU and
26% of a fork server's went to the collector, nearly all of it during imports.

So a command starts with gen0's threshold raised (``start_up``), and once its imports are done
(``settle``: before a zygote or fork server is forked, when a job starts) what exists is frozen
(``gc.freeze``: moved to a generation no collection scans, and never touched again, so a forked
child does not copy its pages either) and the defaults come back. A process that only imports
(the zygote, the fork server) does so without the collector at all (``importing``). The costs: a reference
cycle that is garbage at the moment of freezing is never freed (objects made later are collected
as usual), and a command that never settles (``eval``, ``track sync``) keeps the raised threshold:
its collector still runs, after every 100,000 net allocations instead of 700. Only hpcpipe's own
processes are touched: a program of a user's that imports hpcpipe and calls ``run_job`` keeps its
collector as it set it (``settle`` does nothing where ``start_up`` never ran).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

__all__ = ["STARTUP_THRESHOLD", "importing", "settle", "start_up"]

STARTUP_THRESHOLD = 100_000  # allocations between gen0 collections while a command imports
_DEFAULTS = gc.get_threshold()  # CPython's (700, 10, 10) unless the interpreter was told otherwise
# "started": start_up ran in this process or one it was forked from (an `hpcpipe` command, the
# tests); "pid": the process that froze its heap last (a forked child differs).
_STATE: dict[str, int] = {}


def start_up() -> None:
    """Raise gen0's threshold for a command's imports (``settle`` brings the defaults back)."""
    _STATE["started"] = 1
    gc.set_threshold(max(STARTUP_THRESHOLD, _DEFAULTS[0]), *_DEFAULTS[1:])


def settle() -> None:
    """The imports are done: freeze every object that exists (once per process: a later call,
    after a job that may have left cycles behind, would keep them forever) and restore the
    default thresholds. Nothing in a program that never called ``start_up``: a user's own
    process that calls ``run_job`` keeps its collector as it set it."""
    if "started" not in _STATE:
        return
    if _STATE.get("pid") != os.getpid():  # a forked child settles its own imports once
        _freeze()
    gc.set_threshold(*_DEFAULTS)


def _freeze() -> None:
    gc.freeze()
    _STATE["pid"] = os.getpid()


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """Imports without the collector, then frozen: for a process that imports and forks."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _freeze()  # always: what this process imported is all it holds
        gc.set_threshold(*_DEFAULTS)
        if enabled:
            gc.enable()
