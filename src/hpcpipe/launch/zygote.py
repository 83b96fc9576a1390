"""A pre-imported interpreter that ``python -m hpcpipe`` runs are forked from, instead of each
starting a fresh one.

A fresh ``python -m hpcpipe train`` spends about 2 CPU-s importing torch and the CLI, and its
fork server about 2 more on the trainer and its compiler stack, before the job does anything: for
a 6-step, 2-rank run that is two thirds of its CPU (py-spy, 2026-12-02). The verbs that start many
short runs (``hpcpipe recipe check``, ``hpcpipe chaos run``, an HPO worker's trials) fork them from
one zygote per process instead: it imports all that once (``PRELOAD``), and each run is a child
forked from it that then becomes ``python -m hpcpipe ARGS`` as a fresh interpreter would: its own
argv, environment, working directory, stdin/stdout/stderr (rebuilt with the run's buffering),
session (when asked), default handlers for the signals the zygote ignores (Ctrl-C, Slurm's
SIGTERM/SIGUSR1: they end runs, not the zygote), ``hpcpipe.__main__`` run as ``__main__``, and the
interpreter's exit (threads joined, atexit handlers run) without the module teardown.

``run_script`` forks ``python SCRIPT ARGS`` the same way (the benchmark scripts' smoke runs, the
GPU suite's CPU dry run): the script runs as ``__main__``, its own directory first on ``sys.path``.

The zygote never computes: a process forked after an OpenMP parallel region hangs at its own
first one (the reason ``hpcpipe.launch.fork_server`` forks before any torch work too). A verb that
knows it has only imported and read its config so far forks itself into the zygote instead of
starting one (``prestart``: the imports it has done are then free). hpcpipe's one module that reads
its variables at import (``hpcpipe.train.fault_injection``, the chaos faults) reads them again in
each run, from the run's environment.

What the interpreter and the preloaded libraries read from the environment once, at start-up or
import (``IMPORT_TIME_VARS``: the module path, hash seed and warning filters, OpenMP/MKL threads,
the Hugging Face cache and offline switches), the zygote has read already: a run whose environment
differs from the zygote's in one of them gets a fresh interpreter instead (``needs_fresh``), as
does every run while ``HPCPIPE_FRESH_INTERPRETERS=1``. Variables read when used
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``, ``CUDA_VISIBLE_DEVICES``, ...) reach the child as they
are. No prefix rule (``TORCHINDUCTOR_*``, say): torch._dynamo's import sets
``TORCHINDUCTOR_CACHE_DIR`` in its process, so the caller's environment would differ from the
zygote's after its first compile-stack import, and every later run would be a fresh interpreter.
The zygote's own stderr is a log file, never a terminal, so consoles built at import decide on
colour as for a captured run (``prestart`` declines where its caller is on a terminal).

Protocol, over a socketpair: the caller sends one JSON request (argv, env, cwd, session) with three
file descriptors (stdin, stdout, stderr); the zygote forks, answers the child's pid once the child
has taken the default handlers for the signals the zygote ignores (a signal the caller sends the
pid at once is not lost), waits for it and answers its wait status and CPU seconds
(``os.wait4``). The caller kills the pid (or its tree) on timeout. A caller killed outright
closes its end without a word: the zygote then kills the run (``_end_if_the_caller_goes``), as
nobody is left to wait for it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from hpcpipe.launch import fork_server, heap
from hpcpipe.launch.exit import SHIELDED_SIGNALS
from hpcpipe.launch.zygote_child import become, become_hpcpipe, become_script

# What ``python -m hpcpipe`` imports on its way to training, and what the fork server of a
# multi-rank run preloads (``hpcpipe.launch.job.WORKER_PRELOAD``); the caller adds what its runs'
# recipes import (their worker_imports). The CLI itself (0.2 s more) is a room above: a zygote
# ``prestart`` forked from a verb has it already. Importing none of these starts a Python thread;
# peft is never preloaded (it starts a native one).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "hpcpipe.launch.worker",
    "hpcpipe.train.trainer",
)
NEVER_PRELOAD = ("peft",)  # starts a native thread at import: no fork after it is safe
FRESH_VAR = "HPCPIPE_FRESH_INTERPRETERS"
_HEADER = struct.Struct("!I")
READY_S = 10  # the longest a run's pid waits for the run to take its signals (_wait_ready)
_MAX_FDS = 3

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
    "TORCH_LOGS",  # torch's logging, set up when torch imports
    "TORCH_COMPILE_DISABLE",  # read into torch._dynamo's config at its import
)


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


def _import_time(env: dict[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in IMPORT_TIME_VARS}


class ZygoteEnded(RuntimeError):
    """The zygote died while its run ran (killed from outside: it ignores the signals that end runs)."""


def _wait_gone(pid: int, timeout: float | None) -> None:
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.2)


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class Zygote:
    """This process's end of a zygote, serving one run at a time: started as a fresh interpreter
    with this process's environment and ``preload`` imported besides ``PRELOAD``, or forked from
    this process by ``prestart``."""

    def __init__(
        self,
        preload: tuple[str, ...] = (),
        forked: tuple[socket.socket, int] | None = None,
        cwd: Path | None = None,
        name: str = "zygote",
    ) -> None:
        self.name = name  # its key in _ZYGOTE
        self.env = _zygote_env()
        self.log = ""
        if forked is not None:
            self.sock, pid = forked
            self.server: _Server = _ForkedServer(pid)
            self.lock = threading.Lock()
            return
        ours, theirs = socket.socketpair()
        fd, self.log = tempfile.mkstemp(prefix="hpcpipe-zygote-", suffix=".log")
        atexit.register(_remove, self.log)
        self.server = subprocess.Popen(
            [sys.executable, "-m", "hpcpipe.launch.zygote", str(theirs.fileno()), *preload],
            pass_fds=(theirs.fileno(),),
            cwd=cwd,  # where ``preload``'s own modules resolve from (the first entry of sys.path)
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
        self, argv: list[str], cwd: Path, env: dict[str, str], how: Launch, script: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -m hpcpipe ARGV`` (or ``python SCRIPT ARGV``) forked; the lock must be held.
        Past ``how.timeout``, ``how.kill(pid)`` and TimeoutExpired (with the output so far)."""
        command = _command(argv, script)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull) as null:
            request = {"argv": argv, "env": env, "cwd": str(cwd), "session": how.new_session}
            request["script"] = None if script is None else str(script)
            stdio = (null.fileno(), out.fileno(), err.fileno())
            if how.output is not None:
                stdio = (null.fileno(), how.output, how.output)
            try:
                send_message(self.sock, request, stdio)
                pid = int(receive_message(self.sock)[0]["pid"])  # type: ignore[call-overload]
            except (EOFError, OSError) as exc:
                self.close()
                ended = f"hpcpipe's zygote ended (exit {self.server.wait(timeout=30)})"
                raise RuntimeError(f"{ended}; its log: {self.log}" if self.log else ended) from exc
            try:
                if how.started is not None:
                    how.started(pid)
                status, timed_out, cpu_s = self._wait(pid, how.timeout, how.kill)
            except ZygoteEnded:  # the run went on without it (and ended): its exit code is lost
                self.close()
                raise
            except BaseException:  # Ctrl-C, a caller's own timeout: the run dies, the next gets a new zygote
                how.kill(pid)
                self.close()
                raise
            stdout, stderr = _text(out), _text(err)
        if how.ended is not None:
            how.ended(cpu_s)
        if timed_out:
            raise subprocess.TimeoutExpired(command, how.timeout or 0.0, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, os.waitstatus_to_exitcode(status), stdout, stderr)

    def _wait(self, pid: int, timeout: float | None, kill: Callable[[int], None]) -> tuple[int, bool, float]:
        """The run's wait status, whether it was killed for running past ``timeout``, and its CPU
        seconds."""
        self.sock.settimeout(timeout)
        try:
            status, cpu_s = _ended(receive_message(self.sock)[0])
            return status, False, cpu_s
        except TimeoutError:
            kill(pid)
        except (EOFError, OSError):  # the zygote died (its run is an orphan now): wait it out
            _wait_gone(pid, timeout)
            raise ZygoteEnded(f"hpcpipe's zygote ended while run {pid} ran; its exit code is lost") from None
        finally:
            self.sock.settimeout(None)
        status, cpu_s = _ended(receive_message(self.sock)[0])
        return status, True, cpu_s

    def close(self) -> None:
        self.sock.close()  # the zygote exits at end of file
        if _ZYGOTE.get(self.name) is self:
            del _ZYGOTE[self.name]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.wait(timeout=30)  # reaped once its current child is


def _ended(message: dict[str, object]) -> tuple[int, float]:
    """A run's end as the zygote answers it: its wait status and CPU seconds."""
    status, cpu_s = message["status"], message["cpu_s"]
    assert isinstance(status, int) and isinstance(cpu_s, (int, float))
    return status, float(cpu_s)


class _Server(Protocol):
    """The zygote process as its caller sees it (``subprocess.Popen`` has these two methods)."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class _ForkedServer:
    """A zygote ``prestart`` forked: this process's child, reaped here."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode


def _zygote_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for var in ("COLUMNS", "NO_COLOR", "FORCE_COLOR"):  # each run's own, never the zygote's
        env.pop(var, None)
    return env


def prestart(preload: tuple[str, ...] = ()) -> bool:
    """Fork this process into its zygote now (``preload`` then imported in it), instead of starting
    one as a fresh interpreter at the first run: the imports this process has done are the
    zygote's for free.

    Call it only before this process computed anything with torch or started a thread (a child
    forked after an OpenMP parallel region hangs at its own first one; see ``fork_server``). True
    when this process has a zygote now; False where it is left to the first run to start one (no
    zygote asked for; a thread, native ones too, a fork server or a resource tracker running here,
    which a forked zygote must not share; or a terminal, whose colours this process's consoles chose
    at their construction and a run's captured output must not get)."""
    if os.environ.get(FRESH_VAR) == "1":
        return False
    if "zygote" in _ZYGOTE:
        return True
    if _threads() > 1 or fork_server.helpers_running() or _on_a_terminal():
        return False
    ours, theirs = socket.socketpair()
    heap.settle()  # this process's imports: frozen here and in the zygote
    pid = fork_server.fork_flushed()
    if pid == 0:
        ours.close()
        _forked_main(theirs, preload)
    theirs.close()
    _ZYGOTE["zygote"] = Zygote(forked=(ours, pid))
    return True


def _shield() -> None:
    """The zygote outlives what ends its runs: Ctrl-C (its caller's terminal) and the signals Slurm
    sends every process of a step (its caller forwards them to the run, which checkpoints); the
    caller's end of file ends it. Each run restores the defaults (``zygote_child.become``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in SHIELDED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _threads() -> int:
    """This process's threads, native ones included (Linux ``/proc``; Python's count elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _on_a_terminal() -> bool:
    return any(stream is not None and stream.isatty() for stream in (sys.stdout, sys.stderr))


def _forked_main(sock: socket.socket, preload: tuple[str, ...]) -> None:
    """The forked zygote: quiet stdio, then ``main``'s imports and loop (its exit handlers are its
    parent's import-time ones, as a fresh interpreter's would be: ``prestart`` runs before the
    parent did anything else). Never returns."""
    code = 0
    try:
        _shield()
        null = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        os.close(null)
        serve_preloaded(sock, preload)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 1
    os._exit(code)


# This process's zygotes by name, once started (a dict, not a global rebound).
_ZYGOTE: dict[str, Zygote] = {}


@dataclass(frozen=True)
class Launch:
    """How a run starts and ends, beside its argv, directory and environment."""

    timeout: float | None = None  # seconds; past them kill(pid) and TimeoutExpired
    new_session: bool = False  # its own session (and process group), as start_new_session
    kill: Callable[[int], None] = kill_pid  # on timeout, Ctrl-C or the caller's own exception
    output: int | None = None  # a descriptor for stdout and stderr both (None: both captured)
    started: Callable[[int], None] | None = None  # told the run's pid once it runs
    # Told a forked run's CPU seconds (user + system, what it reaped included) once it ended: the
    # zygote reaps it, so the caller's RUSAGE_CHILDREN never counts it (a fresh run's does).
    ended: Callable[[float], None] | None = None


def run_hpcpipe(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    how: Launch = Launch(),
    preload: tuple[str, ...] = (),
    zygote_cwd: Path | None = None,
    zygote_name: str = "zygote",
) -> subprocess.CompletedProcess[str]:
    """``python -m hpcpipe ARGV`` in ``cwd`` with exactly ``env``, started and bounded as ``how``
    says, its output captured as ``subprocess.run(capture_output=True, text=True)`` does (or written
    to ``how.output``). Forked from this process's zygote (started on first use, in ``zygote_cwd``,
    with ``preload`` imported too; a caller that wants its own preload names its own zygote), or a
    fresh interpreter where the zygote cannot stand in for one (``needs_fresh``,
    ``HPCPIPE_FRESH_INTERPRETERS=1``) or is busy with another thread's run."""
    return _run(argv, None, cwd, env, how, preload, zygote_cwd, zygote_name)


def run_script(
    script: Path,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    how: Launch = Launch(),
    preload: tuple[str, ...] = (),
    zygote_cwd: Path | None = None,
    zygote_name: str = "zygote",
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGV``, as ``run_hpcpipe`` runs ``python -m hpcpipe ARGV``: the script runs as
    ``__main__`` with its own directory first on ``sys.path`` (the benchmark scripts' smoke runs)."""
    return _run(argv, script, cwd, env, how, preload, zygote_cwd, zygote_name)


def _run(
    argv: list[str],
    script: Path | None,
    cwd: Path,
    env: dict[str, str],
    how: Launch,
    preload: tuple[str, ...],
    zygote_cwd: Path | None,
    zygote_name: str,
) -> subprocess.CompletedProcess[str]:
    zygote = _ZYGOTE.get(zygote_name)
    if os.environ.get(FRESH_VAR) != "1":
        if zygote is None or zygote.server.poll() is not None:
            zygote = _ZYGOTE[zygote_name] = Zygote(preload, cwd=zygote_cwd, name=zygote_name)
        if not zygote.needs_fresh(env) and zygote.lock.acquire(blocking=False):
            try:
                return zygote.run(argv, cwd, env, how, script)
            finally:
                zygote.lock.release()
    return _run_fresh(_command(argv, script), cwd, env, how)


def _command(argv: list[str], script: Path | None) -> list[str]:
    """What a fresh interpreter would be started with."""
    head = ["-m", "hpcpipe"] if script is None else [str(script)]
    return [sys.executable, *head, *argv]


def _run_fresh(
    command: list[str], cwd: Path, env: dict[str, str], how: Launch
) -> subprocess.CompletedProcess[str]:
    captured = how.output is None
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if captured else how.output,
        stderr=subprocess.PIPE if captured else subprocess.STDOUT,
        text=True,
        start_new_session=how.new_session,
    )
    try:
        if how.started is not None:
            how.started(proc.pid)
        out, err = proc.communicate(timeout=how.timeout)
    except subprocess.TimeoutExpired:
        how.kill(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(command, how.timeout or 0.0, output=out, stderr=err) from None
    except BaseException:
        how.kill(proc.pid)
        proc.wait()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out or "", err or "")


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _text(stream: IO[bytes]) -> str:
    """Captured bytes as ``subprocess.run(text=True)`` decodes them (universal newlines)."""
    stream.seek(0)
    data = stream.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


def serve(sock: socket.socket) -> dict[str, object]:
    """Answer requests until the caller closes its end; returns only in a forked child, with the
    request that child is to run."""
    while True:
        try:
            request, fds = receive_message(sock)
        except (EOFError, OSError):
            os._exit(0)
        ready, told = os.pipe()
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.close(ready)
            become(request, fds, told)
            return request
        os.close(told)
        for fd in fds:
            os.close(fd)
        try:
            _wait_ready(ready)
            send_message(sock, {"pid": pid})
        finally:  # reaped even when the caller went away
            _end_if_the_caller_goes(sock, pid, bool(request.get("session")))
            _, status, usage = os.wait4(pid, 0)
        try:
            send_message(sock, {"status": status, "cpu_s": usage.ru_utime + usage.ru_stime})
        except OSError:
            os._exit(0)


def _wait_ready(ready: int) -> None:
    """Until the child has restored the signals the zygote ignores (``become``), then the caller
    gets its pid: a SIGTERM sent at once (an HPO worker stopped, or its trial's heartbeat lapsed,
    while the trial started) met the inherited SIG_IGN and was lost, and the trial trained to its
    end. End of file (the child died first) or READY_S without a word: answered all the same."""
    try:
        poller = select.poll()
        poller.register(ready, select.POLLIN | select.POLLHUP)
        poller.poll(READY_S * 1000)
    finally:
        os.close(ready)


def _end_if_the_caller_goes(sock: socket.socket, pid: int, own_session: bool) -> None:
    """Return once run ``pid`` has ended; SIGKILL it (its process group, when it has its own
    session) if the caller's end closes first. A caller killed outright (an HPO worker SIGKILLed)
    runs no code of its own, so this is what ends its run: nobody would wait for it, and an HPO
    retry would resume in its run directory while it still trained there. Its workers end with it
    (``parent_death``). The caller sends nothing while a run runs: readable means end of file."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): wait as before
        return
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(sock, select.POLLIN | select.POLLHUP)
        while all(fd != pidfd for fd, _ in poller.poll()):
            try:
                if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    poller.unregister(sock)  # not the caller's end: keep waiting for the run alone
                    continue
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                pass  # the caller's end is broken: gone as well
            _kill_run(pid, own_session)
            return
    finally:
        os.close(pidfd)


def _kill_run(pid: int, own_session: bool) -> None:
    if own_session:  # its group, once its setsid has made one (before that, the run alone)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    kill_pid(pid)


def serve_preloaded(sock: socket.socket, preload: tuple[str, ...]) -> None:
    """Import ``PRELOAD`` and ``preload``, then serve ``sock``; in each forked child, become the
    run (never returns there)."""
    import importlib

    # Without the collector, then frozen: children never scan (or copy) the preloaded objects.
    with heap.importing():
        for name in (*PRELOAD, *[m for m in preload if m not in NEVER_PRELOAD]):
            with contextlib.suppress(
                Exception
            ):  # optional, or broken: a run that needs it imports it and says why
                importlib.import_module(name)
    request = serve(sock)
    argv, script = request["argv"], request.get("script")
    assert isinstance(argv, list)
    if script:
        become_script(str(script), argv)
    become_hpcpipe(argv)


def main() -> None:
    _shield()
    serve_preloaded(socket.socket(fileno=int(sys.argv[1])), tuple(sys.argv[2:]))


if __name__ == "__main__":
    main()
