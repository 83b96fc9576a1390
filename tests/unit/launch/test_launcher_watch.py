"""``launcher_watch``: a worker named its launcher in the environment ends when that process ends,
whoever its parent is; at once when the launcher has already gone, or its pid now belongs to
another process; not at all when nothing names a launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import gone_within, process_alive

from hpcpipe.launch.launcher_watch import LAUNCHER_VAR, launcher_identity, watch_the_launcher

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's"),
    pytest.mark.timeout(120),
]

# A worker: watches the launcher its environment names, writes its pid, sleeps.
WORKER = """import os, sys, time
from hpcpipe.launch.launcher_watch import watch_the_launcher
print("watching" if watch_the_launcher() else "unwatched", flush=True)
print("still named" if "{var}" in os.environ else "not handed on", flush=True)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""

# A launcher: names itself, starts the worker under a shell that stays its parent (as a profiler
# does) and is not told to end with anything, then waits to be killed.
LAUNCHER = """import os, subprocess, sys
from hpcpipe.launch.launcher_watch import LAUNCHER_VAR, launcher_identity
os.environ[LAUNCHER_VAR] = launcher_identity()
shell = '"$0" "$1" "$2" > "$2.out" 2>&1; echo done'
subprocess.Popen(["sh", "-c", shell, sys.executable, sys.argv[1], sys.argv[2]])
os.read(0, 1)
"""


def test_the_worker_ends_when_the_launcher_is_killed_whoever_its_parent_is(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER.format(var=LAUNCHER_VAR))
    pid_file = tmp_path / "worker.pid"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "worker.py"), str(pid_file)], stdin=subprocess.PIPE
    )
    worker = 0
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        assert Path(f"{pid_file}.out").read_text().splitlines() == ["watching", "not handed on"]
        time.sleep(0.3)
        assert process_alive(worker)  # watching costs nothing while the launcher lives
        launcher.kill()
        launcher.wait(timeout=10)
        assert gone_within(worker, 10), "the worker outlived its launcher"
        assert "launcher" in Path(f"{pid_file}.out").read_text()  # it said why it ended
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if worker and process_alive(worker):
            os.kill(worker, signal.SIGKILL)


def _watch_in_a_child(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != LAUNCHER_VAR}
    if value is not None:
        env[LAUNCHER_VAR] = value
    code = "from hpcpipe.launch.launcher_watch import watch_the_launcher as w; print(w())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_launcher_already_gone_or_its_pid_reused_ends_the_worker_at_once() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    ended = _watch_in_a_child(f"{gone.pid}:1")
    assert ended.returncode == -signal.SIGKILL and f"launcher {gone.pid} has ended" in ended.stderr
    # This process lives, but it is not the one named: its start time differs (its pid was reused).
    reused = _watch_in_a_child(f"{os.getpid()}:1")
    assert reused.returncode == -signal.SIGKILL and f"launcher {os.getpid()} has ended" in reused.stderr


@pytest.mark.parametrize("value", [None, "", "not-a-pid", ":123"])
def test_without_a_launcher_named_nothing_is_watched(value: str | None) -> None:
    proc = _watch_in_a_child(value)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_the_identity_is_the_pid_and_start_time_and_the_variable_is_not_handed_on() -> None:
    pid, _, start = launcher_identity().partition(":")
    assert int(pid) == os.getpid() and start.isdigit()
    env = {LAUNCHER_VAR: launcher_identity(), "OTHER": "1"}
    # This process names itself: a daemon thread waits on its own pidfd, which cannot turn readable
    # while it runs (watching another process here would SIGKILL the test run when that one ends).
    assert watch_the_launcher(env) is True
    assert env == {"OTHER": "1"}


def test_hpcpipes_worker_watches_the_launcher_its_environment_names(tmp_path: Path) -> None:
    """``python -m hpcpipe.launch.worker`` (what a profiler runs) watches first thing: named a
    launcher that has gone, it ends before it reads its config."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    env = {**os.environ, LAUNCHER_VAR: f"{gone.pid}:1"}
    command = [sys.executable, "-m", "hpcpipe.launch.worker", str(tmp_path / "missing.yaml")]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert f"launcher {gone.pid} has ended" in proc.stderr and "missing.yaml" not in proc.stderr
