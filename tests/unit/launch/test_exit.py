"""How a worker forked from the agent's fork server ends and reports its code (launch/exit.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from hpcpipe.launch import agent, fork_server
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
    assert fork_server.exit_dir() == fork_server.exit_dir()
    assert Path(fork_server.exit_dir()).is_dir()
