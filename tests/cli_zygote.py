"""A pre-imported interpreter that the tests' ``run_cli`` forks ``python -m hpcpipe`` from.

Every ``run_cli`` used to start a fresh ``python -m hpcpipe``: about 3 CPU-s of imports (torch,
its compiler stack, the trainer) before the verb did anything, for some 200 runs a suite, on a
2-core machine where the suite is CPU-bound. One zygote per test process imports all that once;
each run is a child forked from it that then becomes ``python -m hpcpipe ARGS`` as a fresh
interpreter would: its own argv, environment, working directory, stdin/stdout/stderr and default
signal handlers, ``hpcpipe.__main__`` run as ``__main__``, and the interpreter's exit (threads
joined, atexit handlers run) without the module teardown.

The zygote never computes: a process forked after an OpenMP parallel region hangs at its own
first one (the reason ``hpcpipe.launch.fork_server`` forks before any torch work too). What a
fresh interpreter decides at import from the environment (``OMP_WAIT_POLICY``, thread counts) is
the test process's, which ``run_cli`` passes on unchanged anyway.

What the interpreter and the preloaded libraries read from the environment once, at start-up
or import (``IMPORT_TIME_VARS``: the module path, hash seed and warning filters, OpenMP/MKL
threads, the Hugging Face cache and offline switches), the zygote has read already: a run whose
environment differs from the zygote's in one of them gets a fresh interpreter instead
(``needs_fresh``). Variables read when used (``TORCH_*``, ``CUDA_VISIBLE_DEVICES``, ...) reach the
child as they are; hpcpipe itself sets some of those in the test process (the elastic agent's
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``), so a prefix rule would send every later run to a fresh
interpreter. The zygote's own stderr is a log file, never a terminal, so consoles built at
import decide on colour as for a captured run.

``HPCPIPE_TEST_FRESH_CLI=1`` makes ``run_cli`` start fresh interpreters always; tests that need
the ``hpcpipe`` console script or interpreter start-up itself use ``subprocess`` directly.

Protocol, over a socketpair: the test process sends one JSON request (argv, env, cwd) with three
file descriptors (stdin, stdout, stderr); the zygote forks, answers the child's pid, waits for it
and answers its wait status. The test process kills the pid on timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

# What ``python -m hpcpipe`` imports on its way to training, and what the fork server of a
# multi-rank run preloads (``hpcpipe.launch.job.WORKER_PRELOAD``, the recipes' worker_imports).
# Importing none of these starts a Python thread; peft is left out (it starts a native one).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "hpcpipe.cli.app",
    "hpcpipe.launch.worker",
    "hpcpipe.train.trainer",
    "torchvision",
    "transformers",
)
_HEADER = struct.Struct("!I")
_MAX_FDS = 3


def send_message(sock: socket.socket, payload: dict[str, object], fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(payload).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data)) + data], list(fds))


def receive_message(sock: socket.socket) -> tuple[dict[str, object], list[int]]:
    """One message and the descriptors sent with it; EOFError when the peer closed."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not head:
        raise EOFError
    (size,) = struct.unpack("!I", _recv_exactly(sock, _HEADER.size, head))
    return json.loads(_recv_exactly(sock, size, b"")), fds


def _recv_exactly(sock: socket.socket, size: int, have: bytes) -> bytes:
    while len(have) < size:
        chunk = sock.recv(size - len(have))
        if not chunk:
            raise EOFError
        have += chunk
    return have


# Read once, at interpreter start-up (PYTHON*), when libgomp/MKL load with torch, or when
# huggingface_hub and transformers import: a child forked from the zygote would not see a change.
IMPORT_TIME_VARS = (
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONWARNINGS",
    "PYTHONSAFEPATH",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "MKL_NUM_THREADS",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_CACHE",
    "TRANSFORMERS_OFFLINE",
)


def _import_time(env: dict[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in IMPORT_TIME_VARS}


class _Client:
    """The test process's end of a zygote (started on first use)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for var in ("COLUMNS", "NO_COLOR", "FORCE_COLOR"):  # each run's own, never the zygote's
            self.env.pop(var, None)
        fd, self.log = tempfile.mkstemp(prefix="hpcpipe-cli-zygote-", suffix=".log")
        atexit.register(_remove, self.log)
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_zygote", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            cwd=Path(__file__).resolve().parent.parent,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=fd,
        )
        os.close(fd)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()  # one request at a time on the socket

    def needs_fresh(self, env: dict[str, str]) -> bool:
        """The run sets an import-time variable the zygote saw otherwise."""
        return _import_time(env) != _import_time(self.env)

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hpcpipe", *argv]
        with (
            self.lock,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            open(os.devnull) as null,
        ):
            request = {"argv": argv, "env": env, "cwd": str(cwd)}
            try:
                send_message(self.sock, request, (null.fileno(), out.fileno(), err.fileno()))
                pid = int(receive_message(self.sock)[0]["pid"])  # type: ignore[call-overload]
            except (EOFError, OSError) as exc:
                self.close()
                raise RuntimeError(
                    f"the CLI zygote ended (exit {self.server.wait()}); its log: {self.log}"
                ) from exc
            try:
                status, timed_out = self._wait(pid, timeout)
            except BaseException:  # a pytest timeout, Ctrl-C: the run dies, the next gets a new zygote
                _kill(pid)
                self.close()
                raise
            stdout, stderr = _text(out), _text(err)
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, os.waitstatus_to_exitcode(status), stdout, stderr)

    def _wait(self, pid: int, timeout: float) -> tuple[int, bool]:
        """The run's wait status, and whether it was killed for running past ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return int(receive_message(self.sock)[0]["status"]), False  # type: ignore[call-overload]
        except TimeoutError:
            _kill(pid)
        finally:
            self.sock.settimeout(None)
        return int(receive_message(self.sock)[0]["status"]), True  # type: ignore[call-overload]

    def close(self) -> None:
        self.sock.close()  # the zygote exits at end of file
        _CLIENT.clear()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.wait(timeout=30)  # reaped once its current child is


# This test process's client, if it started one (a dict, not a global rebound).
_CLIENT: dict[str, _Client] = {}


def run_forked(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m hpcpipe ARGV`` forked from this test process's zygote, in ``cwd`` with exactly
    ``env``; its output captured as ``subprocess.run(capture_output=True, text=True)`` does,
    killed (and TimeoutExpired raised) past ``timeout`` seconds."""
    client = _CLIENT.get("client")
    if client is None or client.server.poll() is not None:
        client = _CLIENT["client"] = _Client()
    if client.needs_fresh(env):
        command = [sys.executable, "-m", "hpcpipe", *argv]
        return subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    return client.run(argv, cwd, env, timeout)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _text(stream: IO[bytes]) -> str:
    """Captured bytes as ``subprocess.run(text=True)`` decodes them (universal newlines)."""
    stream.seek(0)
    data = stream.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


def serve(sock: socket.socket) -> dict[str, object]:
    """Answer requests until the test process closes its end; returns only in a forked child,
    with the request that child is to run."""
    while True:
        try:
            request, fds = receive_message(sock)
        except (EOFError, OSError):
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            sock.close()
            _become(request, fds)
            return request
        for fd in fds:
            os.close(fd)
        try:
            send_message(sock, {"pid": pid})
        finally:  # reaped even when the test process went away
            _, status = os.waitpid(pid, 0)
        try:
            send_message(sock, {"status": status})
        except OSError:
            os._exit(0)


def _become(request: dict[str, object], fds: list[int]) -> None:
    """This forked child takes the request's stdio, environment, directory and signals."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    cwd = str(request["cwd"])
    os.chdir(cwd)
    sys.path[0] = cwd  # ``python -m`` puts the working directory first


def run_hpcpipe(argv: list[str]) -> None:
    """``python -m hpcpipe ARGV`` in this forked child, leaving as the interpreter would (threads
    joined, atexit handlers run, streams flushed) but without tearing the modules down: with torch
    loaded that teardown costs a forked child ~1.5 s of copied pages, and triton's bindings print
    leak reports during it."""
    import atexit
    import runpy
    import threading

    sys.argv = ["-m", *argv]  # runpy replaces argv[0] with the module's path, as ``-m`` does
    code = 0
    try:
        runpy.run_module("hpcpipe", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:  # the interpreter ends itself with SIGINT
        _leave(threading, atexit)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _leave(threading, atexit)
    os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _leave(threading, atexit) -> None:  # type: ignore[no-untyped-def]
    import ctypes

    threading._shutdown()  # waits for non-daemon threads, as interpreter exit does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # what C extensions buffered in stdio, as exit() would flush


def main() -> None:
    import gc

    sock = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        __import__(name)
    gc.freeze()  # the preloaded objects are never collected: children skip scanning (and copying) them
    request = serve(sock)
    argv = request["argv"]
    assert isinstance(argv, list)
    run_hpcpipe(argv)


if __name__ == "__main__":
    main()
