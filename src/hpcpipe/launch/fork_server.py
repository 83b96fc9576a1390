"""The agent's fork server, forked from the launching process instead of started as a new one.

``parallel.worker_start: forkserver`` forks every worker from one server process that imported
torch and the trainer once. multiprocessing starts that server as a fresh ``python``, which
imports torch all over again: about 2.4 s of CPU for every ``hpcpipe train --nproc N``, HPO trial
and Slurm node, the largest fixed cost of a short run. The launching process has imported torch
already, so ``prestart`` forks it into the server instead; the server then runs multiprocessing's
own loop (``multiprocessing.forkserver.main``), and torch's elastic agent starts workers through
the standard "forkserver" context, unchanged.

Forking is only safe before this process has computed anything with torch: a process forked after
an OpenMP parallel region hangs at its own first one (measured here: GNU libgomp, torch 2.15), and
one forked after ``torch.cuda.is_available()`` cannot use CUDA. So ``prestart`` is called by the
verbs that know they have only read their config yet (``train``, ``run``, ``launch agent``,
``sweep``, ``bench throughput``/``scaling``/``collectives``, ``accept``; ARCHITECTURE.md), before
the data preparation; everywhere else the agent starts multiprocessing's usual server.
multiprocessing keeps its server's pid, address and the pipe it watches for the launcher in
private attributes: they are read and written here only (``prestart`` in the launcher,
``leave_with_the_launcher`` in a worker), and on an interpreter where they are not what this
module knows (``_KNOWN``) ``prestart`` leaves the usual server to the agent.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hpcpipe.errors import UserError
from hpcpipe.launch import heap
from hpcpipe.launch.exit import EXIT_DIR_VAR, SHIELDED_SIGNALS, forget_exit_report, restore_fresh_defaults
from hpcpipe.launch.exit_dirs import SHORT_ROOT, exit_dir, short_launcher_dir
from hpcpipe.launch.parent_death import die_with_the_parent

# The forked server's process name (/proc/PID/comm, 15 characters at most): its command line is
# the launcher's, so this is how the agent and the chaos harness tell it from the launcher.
SERVER_NAME = "hpcpipe-forksrv"
# Its workers' name: keeping the server's, every rank read as a fork server (the chaos harness
# counted a rank's own children as ranks) and `ps` showed N + 1 servers.
WORKER_NAME = "hpcpipe-worker"
_KNOWN = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_lock")
_SERVER_PID: list[int] = []  # [the server's pid] in a server forked here and in its workers


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """SHIELDED_SIGNALS ignored while a server process starts (an ignored signal stays ignored
    across fork and exec): Slurm signals every process of a step, and the server must live on."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SHIELDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, less its NUL)


def _listener_address() -> str:
    """The server's socket in this launcher's exit directory, or in a private directory of /tmp
    when that path is too long for a Unix socket (a scheduler's job-scoped TMPDIR: "AF_UNIX path
    too long" ended every multi-rank run). Both are swept by the next launcher after one killed
    outright; multiprocessing's own (a pymp-* directory) stayed behind. Never the abstract
    namespace: any local user could connect there."""
    address = os.path.join(exit_dir(), "forkserver")
    if len(os.fsencode(address)) <= _SUN_PATH_MAX:
        return address
    try:
        private = short_launcher_dir()  # mode 0700, swept after a launcher killed outright
    except OSError as exc:
        raise UserError(
            f"$TMPDIR is too long for a Unix socket ({address}) and {SHORT_ROOT} is not writable "
            f"({exc.strerror}): set TMPDIR to a shorter path"
        ) from None
    return os.path.join(private, "l")


def _state():  # type: ignore[no-untyped-def]
    """multiprocessing's fork-server record where ``prestart`` can fork the server, else None."""
    if sys.version_info >= (3, 14):  # 3.14 authenticates the server: a key this fork would lack
        return None
    return _record()


def _record():  # type: ignore[no-untyped-def]
    """multiprocessing's fork-server record, or None where it is not the one this module knows."""
    from multiprocessing import forkserver

    state = getattr(forkserver, "_forkserver", None)
    return state if state is not None and all(hasattr(state, a) for a in _KNOWN) else None


def prestart(preload: Sequence[str]) -> bool:
    """Fork this process into multiprocessing's fork server, with ``preload`` imported in it.

    Call it only before this process computed anything with torch (see the module docstring).
    True when the server runs (started now or before); False where the agent must start the usual
    one (an unknown interpreter, or ``start_method`` spawn chosen by the caller).
    """
    state = _state()
    if state is None:
        return False
    from multiprocessing import resource_tracker, util

    import torch  # noqa: F401  (in memory before the fork: what the server is for)

    os.environ[EXIT_DIR_VAR] = exit_dir()  # the server's children, the workers, report there
    with state._lock, shielded():
        resource_tracker.ensure_running()  # one tracker for this process, the server and workers
        if state._forkserver_pid is not None:
            return True
        address = _listener_address()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        heap.settle()  # this process's imports: frozen here and in the server (launch/heap.py)
        pid = fork_flushed()
        if pid == 0:
            _serve(listener, alive_r, alive_w, preload)
        os.close(alive_r)
        listener.close()
        state._forkserver_address, state._forkserver_alive_fd, state._forkserver_pid = address, alive_w, pid
    return True


def _serve(listener: socket.socket, alive_r: int, alive_w: int, preload: Sequence[str]) -> None:
    """The forked server: multiprocessing's loop until the launcher closes its end of ``alive``."""
    _SERVER_PID[:] = [os.getpid()]  # what its workers compare their parent with (leave_with_the_launcher)
    code = 0
    try:
        os.close(alive_w)
        _unlock_the_record()
        with contextlib.suppress(OSError):
            Path("/proc/self/comm").write_text(SERVER_NAME)
        from multiprocessing import forkserver

        with heap.importing():  # what main would import, without the collector, then frozen
            for name in preload:
                with contextlib.suppress(ImportError):  # as main does: a worker that needs it says why
                    importlib.import_module(name)
        forkserver.main(listener.fileno(), alive_r, list(preload))
    except SystemExit as exc:  # how the loop ends when the launcher goes
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        code = 1
    os._exit(code)


def _unlock_the_record() -> None:
    """The server was forked while ``prestart`` held the fork-server record's lock, so the lock is
    held in it and in every process forked from it: a worker whose DataLoader then asked for a
    "forkserver" context would wait on it for ever. No other thread exists here: a fresh lock."""
    import threading

    state = _state()
    if state is not None:
        state._lock = threading.Lock()


def fork_flushed() -> int:
    """``os.fork()`` after flushing this process's stdout and stderr: else the child's copy of an
    unwritten buffer prints a second time."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return os.fork()


def helpers_running() -> bool:
    """Whether this process runs a multiprocessing fork server or resource tracker (a process
    forked from it would share them). Read from multiprocessing's private records, here only."""
    from multiprocessing import resource_tracker

    tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_fd", None)
    return server_pid() is not None or tracker is not None


def server_pid() -> int | None:
    """The pid of this process's fork server, if one runs (forked or multiprocessing's own)."""
    state = _state()
    return getattr(state, "_forkserver_pid", None) if state is not None else None


def is_fork_server(pid: int, command: str) -> bool:
    """Whether ``pid`` (with its ``command`` line) is a fork server: multiprocessing's own or one
    that ``prestart`` forked."""
    if "multiprocessing.forkserver" in command:
        return True
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == SERVER_NAME
    except OSError:
        return False


def begin_forked_worker() -> None:
    """The first step of every process forked from a fork server to be a rank (hpcpipe's and
    ``bench``'s workers, the benchmarks' ranks): what a fresh interpreter would have
    (``exit.restore_fresh_defaults``), and an end that follows the launcher's."""
    restore_fresh_defaults()
    forget_exit_report()
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(WORKER_NAME)
    leave_with_the_launcher()


def leave_with_the_launcher() -> None:
    """End this forked worker when the launcher ends, even when it is killed outright (SIGKILL by
    hand or by the OOM killer).

    multiprocessing gives every child of its fork server a copy of the pipe end the server
    watches for its launcher's exit, so the server lived as long as any worker did, and the
    workers of a SIGKILLed launcher went on training with nothing to end them (measured
    2026-12-03: a 2-rank ``hpcpipe train`` kept both cores busy after its launcher was killed).
    So the worker asks Linux for SIGKILL when its parent, the server, ends, then closes its copy:
    the launcher's exit ends the server's loop, and the workers with it, as a lost node's are.
    SIGKILL replaces the SIGINT torch's ``start_processes`` asks for: SIGINT would run the Ctrl-C
    path, a checkpoint and a stop agreed with every rank, where the launcher that would collect
    it is gone; a lost node is what the rest of the job already knows how to survive. The request
    comes first: a worker that closed its copy first could end the server before asking."""
    # Without a pid (multiprocessing's own server, not forked here): the parent found first thing.
    # Used once: a process this worker forks has another parent.
    die_with_the_parent(parent=_SERVER_PID.pop() if _SERVER_PID else None)
    record = _record()
    if record is not None and record._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(record._forkserver_alive_fd)
        # A "forkserver" context the worker asks for later starts a server of its own, as in a
        # fresh interpreter (its pid is None here already: the server's copy never had it).
        record._forkserver_alive_fd = record._forkserver_address = record._forkserver_pid = None
