"""Stopping a local `hpcpipe train` by hand or by a scheduler: Ctrl-C and SIGTERM end with one
line, no traceback, the documented exit code, and a committed checkpoint where one is due."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.checkpoint.tiers import Tier
from hpcpipe.layout import RunLayout

pytestmark = pytest.mark.timeout(240)


def _stopped(tmp: Path, name: str, sig: signal.Signals, nproc: int, *sets: str) -> tuple[int, str]:
    """Start the run, wait for its first logged step, send ``sig`` as a terminal or a scheduler
    would (Ctrl-C: the whole foreground process group; SIGTERM: the launcher), wait for the end."""
    proc = _training(tmp, name, nproc, *sets)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _training(tmp: Path, name: str, nproc: int, *sets: str) -> subprocess.Popen[str]:
    """A long local run in its own session, once it has logged its first step."""
    args = tiny_job_sets(
        tmp, name, "train.steps=100000", "train.eval_every=0", "observe.progress=false", *sets
    )
    proc = _hpcpipe(tmp, "train", "tiny", "--nproc", str(nproc), *args)
    metrics = RunLayout(tmp / name).metrics
    deadline = time.monotonic() + 150
    while not (metrics.is_file() and metrics.stat().st_size > 0) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    return proc


def _hpcpipe(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``python -m hpcpipe ARGS`` in a session of its own (a shell's foreground job), stderr kept."""
    clean = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    }
    return subprocess.Popen(
        [sys.executable, "-m", "hpcpipe", *args],
        cwd=tmp,
        env={**clean, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _terminated_once(proc: subprocess.Popen[str], ready: Callable[[], bool]) -> str:
    """SIGTERM ``proc`` once ``ready()`` (it must run until then); its stderr once it ended. Killed
    whole if the test fails first."""
    try:
        deadline = time.monotonic() + 150
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _committed(run_dir: Path) -> list[int]:
    return [step for step, _ in Tier("fast", RunLayout(run_dir).checkpoints).committed()]


def test_ctrl_c_on_two_local_ranks_checkpoints_and_exits_130_in_one_line(tmp_path: Path) -> None:
    code, err = _stopped(tmp_path, "ctrl-c", signal.SIGINT, 2, "checkpoint.every_steps=1000")
    assert code == 130, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted") and str(tmp_path / "ctrl-c") in last, err[-2000:]
    assert "death signal" not in err, err[-2000:]  # torch's agent's notice: the ranks say what they did
    assert _committed(tmp_path / "ctrl-c"), "a checkpoint is due: checkpoint.every_steps is set"


def test_sigterm_on_one_local_process_checkpoints_and_exits_75_in_one_line(tmp_path: Path) -> None:
    code, err = _stopped(tmp_path, "term", signal.SIGTERM, 1)
    assert code == 75, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("preempted:"), err[-2000:]
    assert _committed(tmp_path / "term"), "a preemption always checkpoints"


def test_ctrl_c_without_checkpoints_says_so_and_exits_130(tmp_path: Path) -> None:
    code, err = _stopped(tmp_path, "no-ckpt", signal.SIGINT, 1)
    assert code == 130 and "Traceback" not in err, err[-2000:]
    assert "no checkpoint" in err.strip().splitlines()[-1]
    assert _committed(tmp_path / "no-ckpt") == []


def test_sigterm_on_two_local_ranks_through_the_agent_exits_their_code_in_one_line(tmp_path: Path) -> None:
    """--nproc 2 starts the node agent (torch's elastic agent), whose own SIGTERM handling printed
    torchelastic's traceback before, and answered 75 whatever the workers did; the agent passes
    the signal on itself and exits the workers' code: fault.preempt_exit_code once they
    checkpointed (85 here, which the agent used to replace with 75), in one line."""
    code, err = _stopped(tmp_path, "term-2", signal.SIGTERM, 2, "fault.preempt_exit_code=85")
    assert code == 85, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("preempted") and str(tmp_path / "term-2") in last, err[-2000:]
    assert "death signal" not in err and "Closing process" not in err, err[-2000:]
    assert _committed(tmp_path / "term-2"), "a preemption always checkpoints"


def test_sigterm_while_forked_workers_start_is_a_preemption(tmp_path: Path) -> None:
    """Workers forked from the fork server (the default) that have not reached training yet (held
    here before it, as ranks waiting for a late node are) have no handler: they die of the signal
    and report no code. The agent passes SIGTERM on and counts that as the preemption it is (75,
    which Slurm requeues and hpcpipe-torch restarts), not as a kill past the grace (137)."""
    env = {
        "HPCPIPE_CHAOS_HOLD": "world=4",  # never reached: both ranks wait before training
        "HPCPIPE_CHAOS_DIR": str(tmp_path / "chaos"),
    }
    args = tiny_job_sets(tmp_path, "held", "observe.progress=false")
    proc = _hpcpipe(tmp_path, "train", "tiny", "--nproc", "2", *args, env=env)
    started = tmp_path / "held" / "events.jsonl"  # rank 0 recorded the group's start; then the hold
    err = _terminated_once(proc, lambda: started.is_file() and time.time() - started.stat().st_mtime > 1)
    assert proc.returncode == 75, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("preempted"), err[-2000:]


def test_sigterm_to_a_node_agent_waiting_for_its_nodes_exits_75(tmp_path: Path) -> None:
    """A pod evicted (SIGTERM) while its agent waits in the rendezvous: nothing to checkpoint, a
    preemption (75, which hpcpipe-torch restarts), not 143 (or, as a pod's PID 1, a SIGTERM
    ignored until the kubelet's SIGKILL: 137), which fails the job."""
    import socket

    from hpcpipe.netutil import free_port

    config = tmp_path / "job.yaml"
    shown = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "presets", "show", "tiny"],
        capture_output=True,
        text=True,
        check=True,
    )
    config.write_text(shown.stdout.replace("out_dir: runs", f"out_dir: {tmp_path}"))
    port = free_port()
    command = ["launch", "agent", str(config), "--nnodes", "2", "--nproc-per-node", "1"]
    agent = _hpcpipe(tmp_path, *command, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t")

    def waiting() -> bool:  # its rendezvous store listens: the agent waits for the second node
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    err = _terminated_once(agent, waiting)
    assert agent.returncode == 75, err[-2000:]
    assert "Traceback" not in err, err[-2000:]


def _processes() -> list[tuple[int, int, int, str]]:
    """Every live process: (pid, parent pid, process group, name); zombies left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, _, rest = (entry / "stat").read_text().rpartition(")")
            state, ppid, group = rest.split()[:3]
        except (OSError, ValueError):
            continue
        if state != "Z":
            found.append((int(entry.name), int(ppid), int(group), name.partition("(")[2]))
    return found


def _in_group(pgid: int) -> list[tuple[int, int, str]]:
    """The live processes of process group ``pgid``: (pid, parent pid, name)."""
    return [(pid, ppid, name) for pid, ppid, group, name in _processes() if group == pgid]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_sigkilled_launcher_takes_its_fork_server_and_ranks_with_it(tmp_path: Path) -> None:
    """Killed outright (by hand, by the OOM killer), the launcher runs no code of its own: its
    fork server and both ranks must still end, not train on with nobody to stop them."""
    proc = _training(tmp_path, "killed", 2)
    group = _in_group(proc.pid)
    servers = [pid for pid, parent, name in group if name == "hpcpipe-forksrv" and parent == proc.pid]
    ranks = [pid for pid, parent, name in group if parent in servers and name == "hpcpipe-worker"]  # named
    if not (len(servers) == 1 and len(ranks) == 2):
        os.killpg(proc.pid, signal.SIGKILL)  # nothing left behind for the next test
        pytest.fail(f"not the server the launcher forked and its two ranks: {group}")
    proc.kill()
    try:
        proc.communicate(timeout=30)  # stderr closes when the last process holding it has gone
    except subprocess.TimeoutExpired:
        left = _in_group(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)  # nothing left behind for the next test
        pytest.fail(f"still running 30 s after the launcher was killed: {left}")
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10  # the resource tracker ends once nothing holds its pipe
    while _in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _in_group(proc.pid) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_sigkilled_launcher_takes_its_spawned_ranks_with_it(tmp_path: Path) -> None:
    """``parallel.worker_start: spawn``: torch's agent starts each rank as a program of its own,
    in a session of its own (outside the launcher's process group), so nothing of the launcher's
    reached them: they trained on after it was killed (2026-12-03). Each now asks to end with it."""
    proc = _training(tmp_path, "killed-spawn", 2, "parallel.worker_start=spawn")
    ranks = [pid for pid, parent, _, _ in _processes() if parent == proc.pid]
    proc.kill()
    if len(ranks) != 2:  # the launcher's children: its two ranks, nothing else
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the launcher's children were not its two ranks: {ranks}")
    deadline = time.monotonic() + 30
    alive = set(ranks)
    while alive and time.monotonic() < deadline:
        alive &= {pid for pid, _, _, _ in _processes()}
        time.sleep(0.1)
    for pid in alive:  # nothing left behind for the next test
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"ranks {sorted(alive)} still running 30 s after the launcher was killed"
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_run_preempted_at_its_last_step_evaluates_it_when_resumed(tmp_path: Path) -> None:
    """The last step's checkpoint comes before its evaluation: preempted there, the run exits 75
    with the step committed, and the resumed run (nothing left to train) evaluates it, so the
    final val_loss (what a study and a report read) is not lost."""
    import json

    sets = tiny_job_sets(
        tmp_path,
        "last",
        "train.steps=4",
        "train.eval_every=2",
        "checkpoint.every_steps=2",
        "observe.progress=false",
    )
    env = {"HPCPIPE_CHAOS_SIGTERM": "step=4,rank=0"}
    assert run_cli("train", "tiny", *sets, cwd=tmp_path, env=env).returncode == 75
    again = run_cli("train", "tiny", *sets, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = [json.loads(line) for line in RunLayout(tmp_path / "last").metrics.read_text().splitlines()]
    assert [row["step"] for row in rows if "val_loss" in row] == [0, 2, 4]
