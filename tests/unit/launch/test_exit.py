"""How a worker forked from the agent's fork server ends and reports its code (launch/exit.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcpipe.launch import agent, exit_dirs
from hpcpipe.launch.exit import (
    EXIT_DIR_VAR,
    SHIELDED_SIGNALS,
    reported_exit_code,
    restore_fresh_defaults,
    return_or_exit,
)


@pytest.fixture
def exit_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(EXIT_DIR_VAR, str(tmp_path))
    return tmp_path


def _forked(body) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            body()
        finally:
            os._exit(99)
    return pid


def test_a_failed_worker_leaves_with_its_code_and_reports_it(exit_dir: Path) -> None:
    pid = _forked(lambda: return_or_exit(3))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3  # not 99: it left inside return_or_exit
    assert reported_exit_code(pid) == 3


def test_a_successful_worker_returns_after_reporting_0(exit_dir: Path) -> None:
    pid = _forked(lambda: (return_or_exit(0), os._exit(42)))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 42  # returned, so torch can collect its value
    assert reported_exit_code(pid) == 0


def test_a_worker_that_reported_nothing_counts_as_killed(exit_dir: Path) -> None:
    assert reported_exit_code(123456789) == 128 + signal.SIGKILL


def test_the_agent_waits_for_a_forked_worker_through_its_report(exit_dir: Path) -> None:
    pid = _forked(lambda: return_or_exit(75))
    os.waitpid(pid, 0)  # reaped here, as the fork server reaps its children
    assert agent._try_wait(pid) == 75


def test_a_forked_worker_starts_with_a_fresh_interpreters_defaults() -> None:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SHIELDED_SIGNALS}
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        multiprocessing.set_start_method("forkserver", force=True)
        restore_fresh_defaults()
        assert all(signal.getsignal(sig) == signal.SIG_DFL for sig in SHIELDED_SIGNALS)
        default = multiprocessing.get_all_start_methods()[0]  # the platform's default comes first
        assert multiprocessing.get_start_method() == default
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        multiprocessing.set_start_method(method, force=True)


def test_one_exit_directory_per_process_because_the_fork_server_outlives_a_run() -> None:
    # A second run_agent in the same process reuses the running server, whose workers were told
    # the first directory: a new one would lose their codes (read as 137, killed).
    assert exit_dirs.exit_dir() == exit_dirs.exit_dir()
    assert Path(exit_dirs.exit_dir()).is_dir()


def _reaped_pid() -> int:
    """A pid that names no process now: a child's, waited for."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


BOOT = "0123456789abcdef0123456789abcdef"


def test_exit_directories_of_launchers_killed_outright_are_removed_by_the_next(tmp_path: Path) -> None:
    namespace, gone, alive = 4026531836, _reaped_pid(), os.getpid()
    orphan = tmp_path / f"hpcpipe-exit-{BOOT}-{namespace}-{gone}-abc"
    (orphan / "sub").mkdir(parents=True)
    (orphan / "1234").write_text("0")  # a worker's report, left behind
    kept = [
        tmp_path / f"hpcpipe-exit-{BOOT}-{namespace}-{alive}-def",  # a launcher still running
        tmp_path / f"hpcpipe-exit-{BOOT}-{namespace + 1}-{gone}-ghi",  # another pid namespace's
        tmp_path / f"hpcpipe-exit-{BOOT[::-1]}-{namespace}-{gone}-jkl",  # another host's (shared TMPDIR)
        tmp_path / "hpcpipe-exit-x7k2",  # the old naming: nothing to tell its owner by
        tmp_path / f"hpcpipe-exit-{BOOT}-{namespace}-99999999999999999999-mno",  # no such pid number
        tmp_path / f"hpcpipe-exit-{BOOT}-{namespace}-\u00b2-pqr",  # a digit that int() refuses
        tmp_path / f"other-{BOOT}-{namespace}-{gone}-stu",
    ]
    for path in kept:
        path.mkdir()
    not_a_dir = tmp_path / f"hpcpipe-exit-{BOOT}-{namespace}-{gone}-file"
    not_a_dir.write_text("")
    link = tmp_path / f"hpcpipe-exit-{BOOT}-{namespace}-{gone}-link"
    link.symlink_to(kept[0])

    removed = exit_dirs.remove_orphaned_exit_dirs(str(tmp_path), BOOT, namespace)

    assert removed == [str(orphan)] and not orphan.exists()
    assert all(path.is_dir() for path in kept) and not_a_dir.is_file() and link.is_symlink()


@pytest.mark.skipif(not Path("/proc/self/ns/pid").exists(), reason="the owner's facts come from /proc")
def test_a_sigkilled_launchers_exit_directory_goes_with_the_next_launcher(tmp_path: Path) -> None:
    """Real launcher processes: the first makes its directory and dies by SIGKILL (no exit code
    runs), the second sweeps it when it makes its own, and removes its own at its exit."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    make = "from hpcpipe.launch.exit_dirs import exit_dir; print(exit_dir(), flush=True)"
    killed = subprocess.run(
        [sys.executable, "-c", f"{make}; import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    left = Path(killed.stdout.strip())
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    namespace = os.stat("/proc/self/ns/pid").st_ino
    assert left.is_dir() and left.name.startswith(f"hpcpipe-exit-{boot}-{namespace}-")

    after = subprocess.run(
        [sys.executable, "-c", make], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert after.returncode == 0, after.stderr
    assert Path(after.stdout.strip()).parent == tmp_path != left
    assert list(tmp_path.iterdir()) == []  # the orphan swept, the second launcher's own removed at exit


def test_without_an_exit_directory_nothing_is_read_as_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report path was joined onto '' without an exit directory: a file named like the pid
    in the working directory was read as the worker's exit code."""
    from hpcpipe.launch.exit import EXIT_DIR_VAR, reported_exit_code

    monkeypatch.delenv(EXIT_DIR_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "4242").write_text("0")
    assert reported_exit_code(4242) == 137
    monkeypatch.setenv(EXIT_DIR_VAR, str(tmp_path))
    assert reported_exit_code(4242) == 0
