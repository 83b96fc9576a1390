"""The fork server forked from the launcher (``launch/fork_server.py``): it runs multiprocessing's
own loop, so a "forkserver" context starts processes through it, with what the launcher imported
already in memory (and frozen: ``launch/heap.py``); it is named so the agent and the chaos harness
know it; it is started once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpcpipe.launch.fork_server import SERVER_NAME, is_fork_server

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]

# Run in a fresh interpreter: the test process itself must not become a fork server.
SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    from hpcpipe.launch.fork_server import prestart, server_pid

    assert prestart(["json"])
    first = server_pid()
    assert prestart(["json"]) and server_pid() == first  # one server per process
    ctx = multiprocessing.get_context("forkserver")
    child = ctx.Process(target=os._exit, args=(7,))
    child.start()
    child.join(30)
    # A worker's view of the heap it was forked with: frozen (launch/heap.py), collector on.
    probe = "import gc, os; os._exit(11 if gc.get_freeze_count() > 10000 and gc.isenabled() else 12)"
    heap = ctx.Process(target=exec, args=(probe,))
    heap.start()
    heap.join(30)
    # The record's lock, held by prestart while it forked the server, is free in what it forks
    # (a held one hung a rank's DataLoader that asked for a "forkserver" context).
    lock = ("import multiprocessing.forkserver as f, os; "
            "os._exit(13 if f._forkserver._lock.acquire(timeout=5) else 14)")
    locked = ctx.Process(target=exec, args=(lock,))
    locked.start()
    locked.join(30)
    comm = open(f"/proc/{first}/comm").read().strip()
    cmdline = open(f"/proc/{first}/cmdline", "rb").read().split(b"\\0")[0].decode()
    print(json.dumps({"server": first, "code": child.exitcode, "heap": heap.exitcode, "comm": comm,
                      "lock": locked.exitcode,
                      "cmdline": cmdline, "exit_dir": os.environ.get("HPCPIPE_EXIT_DIR", "")}))
    """
)


def test_the_launcher_forks_a_named_server_that_starts_processes_once() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-c", SCRIPT]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["code"] == 7  # a process forked by the server, its exit code passed back
    assert seen["heap"] == 11  # its heap frozen, its collector on
    assert seen["lock"] == 13  # multiprocessing's fork-server lock free in it
    assert seen["comm"] == SERVER_NAME
    # A fork of this interpreter (same command line), not multiprocessing's `python -c ...forkserver`.
    assert seen["cmdline"] == sys.executable
    assert seen["exit_dir"]  # set before the fork: the workers report their codes there


def test_a_fork_server_is_known_by_its_command_or_its_name() -> None:
    assert is_fork_server(1, "python -c from multiprocessing.forkserver import main; main(3, 4)")
    assert not is_fork_server(os.getpid(), "pytest")  # this process: neither


def test_helpers_running_sees_a_resource_tracker() -> None:
    """What ``zygote.prestart`` asks before forking: none in a fresh process, then the tracker."""
    script = textwrap.dedent(
        """
        from multiprocessing import resource_tracker
        from hpcpipe.launch.fork_server import helpers_running
        seen = [helpers_running()]
        resource_tracker.ensure_running()
        seen.append(helpers_running())
        print(seen)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[False, True]"


def test_a_too_long_socket_path_moves_to_a_private_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scheduler's job-scoped TMPDIR: "AF_UNIX path too long" ended every multi-rank run."""
    import stat

    from hpcpipe.launch import fork_server

    monkeypatch.setattr(fork_server, "exit_dir", lambda: "/scratch/" + "j" * 120 + "/hpcpipe-exit-x")
    moved = fork_server._listener_address()
    assert len(moved.encode()) <= 107 and moved.startswith("/tmp/hpcpipe-exit-")  # swept after a SIGKILL
    assert stat.S_IMODE(os.stat(os.path.dirname(moved)).st_mode) == 0o700  # no other user reaches it


def test_the_socket_is_in_the_launchers_exit_directory() -> None:
    """multiprocessing's /tmp/pymp-*/listener-* stayed behind a launcher killed outright: the exit
    directory is swept by the next launcher."""
    from hpcpipe.launch.exit_dirs import exit_dir
    from hpcpipe.launch.fork_server import _listener_address

    assert os.path.dirname(_listener_address()) == exit_dir()
