"""The node's exit code after a preemption signal the agent passed on: the workers' own outcome,
never a guess, and torch's agent kept away from the signals hpcpipe's agent handles."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hpcpipe.launch.agent import AgentSpec, _signals_left_to_torch, preempted_exit_code

TERM, USR1 = int(signal.SIGTERM), int(signal.SIGUSR1)


@pytest.mark.parametrize(
    ("codes", "signum", "expected"),
    [
        ([], TERM, 75),  # no worker had started: nothing to checkpoint, resubmit
        ([75, 75], TERM, 75),  # both checkpointed
        ([75, 143], TERM, 75),  # one committed the checkpoint, the other died of the signal
        ([143, 143], TERM, 75),  # before the trainer's handler (start-up): nothing of theirs failed
        ([138, 0], USR1, 75),
        ([1, 143], TERM, 1),  # a rank crashed on the way out: its code, not a preemption
        ([143, 1], TERM, 1),
        ([137, 75], TERM, 75),  # a checkpoint was committed, whatever the grace's SIGKILL hit
        ([137, 137], TERM, 137),  # SIGKILLed past the grace, nothing committed
        ([2, 2], USR1, 2),  # a user error stays one
        ([0, 0], TERM, 0),  # the run had finished
    ],
)
def test_the_exit_code_is_the_workers_outcome(codes: list[int], signum: int, expected: int) -> None:
    assert preempted_exit_code(codes, signum, preempt_exit_code=75) == expected


def test_a_configured_preempt_exit_code_is_the_one_answered() -> None:
    assert preempted_exit_code([85, 85], TERM, preempt_exit_code=85) == 85
    assert preempted_exit_code([143, 143], TERM, preempt_exit_code=85) == 85
    assert preempted_exit_code([75, 75], TERM, preempt_exit_code=85) == 75  # not ours: a worker's own


def test_sigterm_and_sigusr1_are_the_agents_and_torchs_agent_leaves_them() -> None:
    """torch's LaunchConfig (>= 2.9) names the signals its agent handles; without the field torch
    would take SIGTERM back and answer for the workers."""
    from torch.distributed.launcher.api import LaunchConfig

    ours = AgentSpec(nproc_per_node=1).preempt_signals
    assert set(ours) == {signal.SIGTERM, signal.SIGUSR1}
    assert _signals_left_to_torch(LaunchConfig, ours) == {"signals_to_handle": "SIGINT,SIGHUP,SIGQUIT"}


WORKER = """
import os
from pathlib import Path

Path(os.environ["ATTEMPTS"], f"rank{os.environ['RANK']}-{os.environ['TORCHELASTIC_RESTART_COUNT']}").touch()
os._exit(int(os.environ["EXIT_CODE"]))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("code", "attempts"), [(2, 1), (75, 1), (3, 3)])
def test_a_user_error_or_a_preemption_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, attempts: int
) -> None:
    """torch restarts a group on any non-zero exit: a config error (2) came back max_restarts
    more times, a preemption checkpoint (75) turned into a restart in an allocation about to
    end. Those end the group at once; another failure (3: a hang) is restarted as before."""
    from hpcpipe.launch.agent import run_agent

    (tmp_path / "exiting_worker.py").write_text(WORKER)
    (tmp_path / "attempts").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("ATTEMPTS", str(tmp_path / "attempts"))
    monkeypatch.setenv("EXIT_CODE", str(code))
    spec = AgentSpec(nproc_per_node=1, start_method="spawn", rdzv_id=f"t{code}", max_restarts=2)
    assert run_agent(spec, "exiting_worker", []) == code
    assert len(list((tmp_path / "attempts").iterdir())) == attempts


AFTER_A_PREEMPTION = """
import dataclasses, os, signal, sys, threading, time
from pathlib import Path
from hpcpipe.launch.agent import AgentSpec, run_agent

attempts = Path(os.environ["ATTEMPTS"])

def preempt() -> None:
    while not any(attempts.iterdir()):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGUSR1)

threading.Thread(target=preempt, daemon=True).start()
ignore = os.environ["IGNORE"] == "1"
spec = AgentSpec(nproc_per_node=1, start_method="spawn", rdzv_id="after", grace_s=20)
spec = dataclasses.replace(spec, ignore_sigterm_after_preemption=ignore)
code = run_agent(spec, "sleeping_worker", [])
print(code, signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ignore", [True, False])
def test_sigterm_stays_ignored_after_a_preemption_where_asked(tmp_path: Path, ignore: bool) -> None:
    """srun SIGTERMs the other nodes' agents once one exits 75; they are on their way out of
    the same preemption (memory tier teardown, exit) and must not die of it (143: no requeue).
    A launcher that goes on (a sweep's next point) gets its own handler back: SIGTERM stayed
    ignored there for the rest of the sweep."""
    import subprocess
    import sys

    worker = "import os, time\nfrom pathlib import Path\n"
    worker += "Path(os.environ['ATTEMPTS'], 'started').touch()\ntime.sleep(60)\n"
    (tmp_path / "sleeping_worker.py").write_text(worker)
    (tmp_path / "attempts").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "ATTEMPTS": str(tmp_path / "attempts"),
        "IGNORE": "1" if ignore else "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", AFTER_A_PREEMPTION],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.stdout.split() == ["75", str(ignore)], proc.stdout + proc.stderr[-2000:]


AFTER_A_RUN = """
import signal
from hpcpipe.launch.agent import AgentSpec, run_agent

def mine(signum, frame):
    pass

signal.signal(signal.SIGTERM, mine)
spec = AgentSpec(nproc_per_node=1, start_method="spawn", rdzv_id="handlers")
code = run_agent(spec, "finishing_worker", [])
print(
    code,
    signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,
    signal.getsignal(signal.SIGQUIT) == signal.SIG_DFL,
    signal.getsignal(signal.SIGTERM) is mine,
)
"""


@pytest.mark.timeout(120)
def test_the_launchers_signal_handlers_are_put_back_after_a_run(tmp_path: Path) -> None:
    """torch's agent installs its handler for SIGINT, SIGHUP and SIGQUIT and never removes it: a
    Ctrl-C in the launcher's next step (evaluate after train, a sweep's next point) raised its
    SignalException, a traceback and exit 1 instead of 'interrupted' and 130."""
    import subprocess
    import sys

    (tmp_path / "finishing_worker.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", AFTER_A_RUN], env=env, capture_output=True, text=True, timeout=100, check=False
    )
    assert proc.stdout.split() == ["0", "True", "True", "True", "True"], proc.stdout + proc.stderr[-2000:]


@pytest.mark.timeout(30)
def test_workers_killed_after_the_grace_are_said(capsys: pytest.CaptureFixture[str]) -> None:
    """The node exited 137 after SIGKILLing a worker that outlived the grace, and said nothing."""
    import subprocess
    import sys

    from hpcpipe.launch.agent import _reap

    ignoring = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True)"
    ignoring += "; time.sleep(30)"
    worker = subprocess.Popen([sys.executable, "-c", ignoring], stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None and worker.stdout.readline()  # its handler is in place
        os.kill(worker.pid, signal.SIGTERM)
        assert _reap([worker.pid], grace_s=0.3, signum=TERM) == [137]
    finally:
        worker.kill()
        worker.wait()
    err = capsys.readouterr().err
    assert f"agent: worker(s) {worker.pid} still running 0.3 s after the signal; killed (SIGKILL)" in err
