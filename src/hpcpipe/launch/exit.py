"""Leaving a process that was a gloo/NCCL rank."""

from __future__ import annotations

import contextlib
import os
import sys


def flush_and_exit(code: int) -> None:
    """Flush stdout/stderr, then ``os._exit``: gloo sometimes aborts (SIGABRT) at interpreter
    exit after ``destroy_process_group``, which would turn a finished rank into a failed one."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
