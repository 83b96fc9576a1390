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


PEER_LOST_EXIT_CODE = 4
"""A rank whose collective failed because a peer went away (gloo's "Connection closed by peer",
a reset, a network error): a victim, not the cause. The agent names another failed rank first."""

_PEER_LOST_SIGNS = ("Connection closed by peer", "Connection reset by peer", "remote worker crash")


def lost_a_peer(exc: BaseException) -> bool:
    """Whether ``exc`` says that another rank went away (not that this rank failed)."""
    import torch.distributed as dist

    network_error = getattr(dist, "DistNetworkError", ())
    return isinstance(exc, network_error) or any(sign in str(exc) for sign in _PEER_LOST_SIGNS)
