"""Leaving a process that was a gloo/NCCL rank."""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def flush_and_exit(code: int) -> None:
    """Flush stdout/stderr, then ``os._exit``: gloo sometimes aborts (SIGABRT) at interpreter
    exit after ``destroy_process_group``, which would turn a finished rank into a failed one."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


# A directory the local agent names for its forked workers' exit codes (one file per pid): they are
# the fork server's children, so the agent cannot wait for them itself when it forwards a signal.
EXIT_DIR_VAR = "HPCPIPE_EXIT_DIR"


# Slurm signals every process of a job step (``--signal=USR1@90``, ``scancel --signal``), and a
# terminal's Ctrl-C the whole process group: the fork server and multiprocessing's resource tracker
# must outlive them, so the agent starts both with these ignored (an ignored signal stays ignored
# across exec and fork), and a forked worker restores the defaults before it installs its handlers.
SHIELDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def restore_fresh_defaults() -> None:
    """A forked worker's first step: what a fresh interpreter would have. The default signal
    dispositions, and multiprocessing's platform default start method (a fork server's child
    inherits "forkserver": its DataLoader workers would each wait for a new server's imports)."""
    import multiprocessing

    for sig in SHIELDED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    multiprocessing.set_start_method(None, force=True)


def finish_as_exit_would() -> None:
    """What interpreter exit does before its teardown: wait for the non-daemon threads (and stop
    idle thread-pool workers), run the exit handlers, flush Python's and C's stdio buffers. For
    a process that then leaves with ``os._exit``: a forked CLI run, or one whose teardown misbehaves."""
    import atexit
    import ctypes
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # as interpreter exit does (private CPython)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # what C extensions buffered in stdio, as exit() would flush


def _exit_report(pid: int | None = None) -> str | None:
    """Where the worker ``pid`` (this process) reports its exit code; None without an exit directory."""
    report = os.environ.get(EXIT_DIR_VAR)
    return os.path.join(report, str(os.getpid() if pid is None else pid)) if report else None


def return_or_exit(code: int) -> None:
    """How a worker forked from the agent's fork server ends: torch's elastic agent collects a
    successful worker's return value, so code 0 returns; any other code leaves at once with it
    (``os._exit``: no interpreter teardown, where gloo may abort)."""
    path = _exit_report()
    if path:
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as fh:
                fh.write(str(code))
            os.replace(path + ".tmp", path)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if code != 0:
        os._exit(code)


def forget_exit_report() -> None:
    """A forked worker's first step: remove any exit report under its pid, left by an earlier
    worker of this launcher whose pid it reuses (a worker killed before it could report leaves
    none, and the agent would read the earlier one's code as this worker's)."""
    path = _exit_report()
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


SAID_PREFIX = "said-"  # first_to_say's markers in the exit directory


def forget_what_was_said() -> None:
    """The agent's step before it starts a group: the exit directory outlives one agent run (the
    fork server's workers were told it), and a later job's same refusal must be said again."""
    report = os.environ.get(EXIT_DIR_VAR)
    if not report:
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(report):
            if name.startswith(SAID_PREFIX):
                os.unlink(os.path.join(report, name))


def first_to_say(message: str) -> bool:
    """Whether this forked worker is the first of its node's group to print ``message``: ranks
    refusing the same job say so once per node, not once per rank (8 equal lines on 8 GPUs).
    A worker without an exit directory (torchrun, srun, a spawned worker) always says it."""
    report = os.environ.get(EXIT_DIR_VAR)
    if not report:
        return True
    import hashlib

    said = os.path.join(report, SAID_PREFIX + hashlib.sha256(message.encode()).hexdigest()[:16])
    try:
        os.close(os.open(said, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def a_refusal_was_said() -> bool:
    """Whether a worker of this node's group has printed a refusal (``first_to_say``): its peers,
    whose collectives then failed, have nothing to add to that one line."""
    report = os.environ.get(EXIT_DIR_VAR)
    try:
        return bool(report) and any(name.startswith(SAID_PREFIX) for name in os.listdir(report or "."))
    except OSError:
        return False


def reported_exit_code(pid: int, unreported: int = 128 + 9) -> int:
    """The code a forked worker reported before it ended; ``unreported`` (137, killed, unless
    the caller knows which signal it died of) when it could not."""
    path = _exit_report(pid)
    try:
        if path is None:  # no exit directory: nothing was reported (not a file named PID here)
            return unreported
        with open(path) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return unreported


PEER_LOST_EXIT_CODE = 4
"""A rank whose collective failed because a peer went away (gloo's "Connection closed by peer",
a reset, a network error): a victim, not the cause. The agent names another failed rank first."""

_PEER_LOST_SIGNS = ("Connection closed by peer", "Connection reset by peer", "remote worker crash")


def lost_a_peer(exc: BaseException) -> bool:
    """Whether ``exc`` says that another rank went away (not that this rank failed)."""
    import torch.distributed as dist

    network_error = getattr(dist, "DistNetworkError", ())
    return isinstance(exc, network_error) or any(sign in str(exc) for sign in _PEER_LOST_SIGNS)


def lost_a_peer_in_a_collective(exc: BaseException) -> bool:
    """``lost_a_peer``, raised by a collective (not while the group formed, and not by this
    rank's own connections: an HTTP reset, a DataLoader pipe, a TCPStore it could not reach).
    Only then is this rank's traceback noise that buries the cause's. A collective fails inside
    ``torch.distributed`` (c10d, FSDP2, pipelining, DCP) or inside a backward (DDP's gradient
    all-reduce runs in autograd); the exception's causes are looked through (DCP wraps them)."""
    import traceback

    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    if not any(lost_a_peer(e) for e in chain):
        return False
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)]
    path = [f.filename.replace("\\", "/") for f in frames]
    names = {f.name for f in frames}
    if names & _GROUP_FORMING or any("/torch/distributed/elastic/" in p for p in path):
        return False  # the group was forming: a store or rendezvous this rank could not reach
    return any("/torch/distributed/" in p or "/torch/autograd/" in p for p in path)


# Functions of a group being formed: a failure there is this rank's (its store, its address).
_GROUP_FORMING = frozenset({"init_process_group", "_store_based_barrier", "rendezvous", "new_group"})
