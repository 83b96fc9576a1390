"""What a run forked from hpcpipe's zygote (``hpcpipe.launch.zygote``) does to become its program:
take the request's session, stdio, environment, directory and signals (``become``), then run
``python -m hpcpipe ARGV`` or ``python SCRIPT ARGV`` as ``__main__`` and leave as the interpreter
would, without the module teardown (``become_hpcpipe``, ``become_script``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from hpcpipe.launch.exit import SHIELDED_SIGNALS, finish_as_exit_would


def become(request: dict[str, object], fds: list[int], ready: int | None = None) -> None:
    """This forked child takes the request's session, stdio, environment, directory and signals;
    it closes ``ready`` (a pipe the zygote waits on before it tells the caller this pid) once its
    signals are a fresh interpreter's."""
    if request.get("session"):
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in SHIELDED_SIGNALS:  # the zygote ignores them; a fresh interpreter has the defaults
        signal.signal(sig, signal.SIG_DFL)
    if ready is not None:
        os.close(ready)  # end of file: the zygote answers the pid now
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update(env)
    _fresh_stdio(bool(env.get("PYTHONUNBUFFERED")))
    cwd = str(request["cwd"])
    os.chdir(cwd)
    if not sys.flags.safe_path:  # ``python -m`` puts the working directory first, a script its own
        script = request.get("script")
        sys.path[0] = os.path.dirname(os.path.realpath(str(script))) if script else cwd
    _read_faults_again()


def _fresh_stdio(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr on descriptors 0-2 as a fresh interpreter builds them: the run's
    buffering (PYTHONUNBUFFERED, a terminal or not), not whatever the zygote's caller had."""
    import io

    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        old = getattr(sys, f"__{name}__")
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=fd == 2 or (fd == 1 and raw.isatty()),  # stderr: always, since 3.9
            write_through=unbuffered and fd != 0,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _read_faults_again() -> None:
    """The chaos faults, from the run's environment: a zygote forked from a process that imported
    ``fault_injection`` (``hpcpipe chaos run``, ``recipe check``) holds that process's."""
    name = "hpcpipe.train.fault_injection"
    faults = sys.modules.get(name)
    if faults is None:
        return
    try:
        faults.configure()
    except Exception:  # malformed: the run imports it anew and fails where a fresh interpreter does
        del sys.modules[name]


def become_hpcpipe(argv: list[str]) -> None:
    """``python -m hpcpipe ARGV`` in this forked child, leaving as the interpreter would (threads
    joined, atexit handlers run, streams flushed) but without tearing the modules down: with torch
    loaded that teardown costs a forked child ~1.5 s of copied pages, and triton's bindings print
    leak reports during it."""
    import runpy

    sys.argv = ["-m", *argv]  # runpy replaces argv[0] with the module's path, as ``-m`` does
    _run_as_main(lambda: runpy.run_module("hpcpipe", run_name="__main__", alter_sys=True))


def become_script(script: str, argv: list[str]) -> None:
    """``python SCRIPT ARGV`` in this forked child, leaving as ``become_hpcpipe`` does."""
    import runpy

    sys.argv = [script, *argv]
    _run_as_main(lambda: runpy.run_path(script, run_name="__main__"))


def _run_as_main(run: Callable[[], object]) -> None:
    """``run()`` as the interpreter runs ``__main__``: its exit code, Ctrl-C, an uncaught exception;
    then leave (never returns)."""
    code = 0
    try:
        run()
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:  # the interpreter ends itself with SIGINT
        finish_as_exit_would()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finish_as_exit_would()
    os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
