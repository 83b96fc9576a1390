"""Which rank the agent names when a group fails: the one that failed, not its victims."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcpipe.launch.agent import _report_failure
from hpcpipe.launch.exit import PEER_LOST_EXIT_CODE, lost_a_peer

GLOO_PEER_GONE = (
    "[third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:2435. "
    "This is typically caused by a remote worker crashing."
)


def _failed(**codes: int) -> SimpleNamespace:
    failures = {
        int(r.removeprefix("r")): SimpleNamespace(exitcode=c, local_rank=0, pid=100) for r, c in codes.items()
    }
    return SimpleNamespace(failures=failures)


@pytest.mark.parametrize(
    ("codes", "named", "exit_code"),
    [
        ({"r0": PEER_LOST_EXIT_CODE, "r1": 1}, 1, 1),  # rank 1 raised; rank 0's all-reduce lost it
        ({"r0": PEER_LOST_EXIT_CODE, "r1": -9}, 1, 137),  # rank 1 SIGKILLed (the OOM killer): 128 + 9
        ({"r0": 3, "r1": 1}, 0, 3),  # two failures of their own: the lowest rank
        ({"r0": PEER_LOST_EXIT_CODE, "r1": PEER_LOST_EXIT_CODE}, 0, PEER_LOST_EXIT_CODE),
    ],
)
def test_the_rank_that_failed_is_named_before_its_victims(
    capsys: pytest.CaptureFixture[str], codes: dict[str, int], named: int, exit_code: int
) -> None:
    assert _report_failure(_failed(**codes), max_restarts=2) == exit_code
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"agent: worker rank {named} ") and "after 2 restart(s)" in line


def test_the_line_says_the_nodes_exit_code_and_what_was_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    """It said 'exit code -9' while the node exited 137, and 'gave up after 0 restart(s)'."""
    assert _report_failure(_failed(r0=-9), max_restarts=0) == 137
    line = capsys.readouterr().err.strip()
    assert "failed with exit code 137; no restarts allowed (--max-restarts 0)" in line


@pytest.mark.parametrize("code", [75, 130, 76])
def test_a_preemption_interrupt_or_prune_is_no_failure_line(
    capsys: pytest.CaptureFixture[str], code: int
) -> None:
    """A worker preempted directly (not through the agent) was 'failed with exit code 75'."""
    from hpcpipe.launch.agent import terminal_exit_codes

    assert (
        _report_failure(_failed(r0=code, r1=code), max_restarts=0, terminal=terminal_exit_codes(75)) == code
    )
    assert capsys.readouterr().err == ""


def test_a_gloo_peer_loss_is_recognised() -> None:
    assert lost_a_peer(RuntimeError(GLOO_PEER_GONE))
    assert not lost_a_peer(RuntimeError("chaos: rank 1 fails at step 3 (HPCPIPE_CHAOS_FAIL)"))


VICTIM_WORKER = """
import os, time
from pathlib import Path
from hpcpipe.launch.exit import return_or_exit
from hpcpipe.launch.fork_server import begin_forked_worker

def forked_main(*args):
    begin_forked_worker()
    rank = os.environ["RANK"]
    Path(os.environ["ATTEMPTS"], f"rank{rank}-{os.environ['TORCHELASTIC_RESTART_COUNT']}").touch()
    if rank == "1":
        return_or_exit(2)  # a user error only this rank saw (its shard of the data, say)
    time.sleep(0.3)  # then rank 0's collective loses its peer
    return_or_exit(4)
"""

RUN_AGENT = """
from hpcpipe.launch.agent import AgentSpec, run_agent
spec = AgentSpec(nproc_per_node=2, rdzv_id="victim", max_restarts=2, monitor_interval_s=1.0)
print(run_agent(spec, "victim_worker", []))
"""


@pytest.mark.timeout(120)
def test_a_forked_ranks_user_error_is_seen_behind_its_victim(tmp_path: Path) -> None:
    """torch's multiprocessing context records the first failed worker its join finds: rank 0,
    the victim (4), when both have exited by the agent's poll. The user error of rank 1 (2) was
    lost: the group was restarted twice more and the node answered 4, so an HPO worker retried
    the trial. Every worker's reported exit now counts."""
    (tmp_path / "victim_worker.py").write_text(VICTIM_WORKER)
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "ATTEMPTS": str(attempts),
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AGENT], env=env, capture_output=True, text=True, timeout=100, check=False
    )
    assert proc.stdout.split() == ["2"], proc.stdout + proc.stderr[-2000:]
    assert sorted(p.name for p in attempts.iterdir()) == ["rank0-0", "rank1-0"]
    assert "worker rank 1 " in proc.stderr and "not restarted" in proc.stderr


def test_a_forked_worker_forgets_an_earlier_workers_report_under_its_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exit directory lives as long as the launcher: a worker reusing an earlier one's pid,
    then killed before it could report, would have been read as exiting with the earlier code."""
    from hpcpipe.launch.exit import EXIT_DIR_VAR, forget_exit_report, reported_exit_code

    monkeypatch.setenv(EXIT_DIR_VAR, str(tmp_path))
    (tmp_path / str(os.getpid())).write_text("2")
    assert reported_exit_code(os.getpid(), unreported=0) == 2
    forget_exit_report()
    assert reported_exit_code(os.getpid(), unreported=0) == 0


def test_a_refusal_is_said_once_per_group_and_again_in_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exit directory outlives one agent run (accept, bench: several groups in one process):
    a later job's same refusal was silenced by the first job's marker."""
    from hpcpipe.launch.exit import EXIT_DIR_VAR, first_to_say, forget_what_was_said

    monkeypatch.setenv(EXIT_DIR_VAR, str(tmp_path))
    assert [first_to_say("no"), first_to_say("no"), first_to_say("other")] == [True, False, True]
    forget_what_was_said()  # what the agent does before it starts the next group
    assert first_to_say("no")
    (tmp_path / "1234").write_text("2")  # a worker's exit report stays
    forget_what_was_said()
    assert (tmp_path / "1234").is_file()
