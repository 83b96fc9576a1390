"""Two local "nodes" for the lost-node scenario: two ``hpcpipe launch agent`` processes that
join one c10d rendezvous on loopback (``--nnodes 1:2``), as two hosts of an elastic job would.

The first agent binds the rendezvous store (torch lets the first agent on a host host it), so
losing the second node loses no store. The second node's workers carry a HANG fault at the
drawn step: when its marker appears the harness SIGKILLs that node, agent and workers, at a
step the seed decides rather than whenever a poll happens to look.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from hpcpipe.chaos import jobs
from hpcpipe.chaos.scenario import TrialContext
from hpcpipe.config import load_config
from hpcpipe.layout import RunLayout
from hpcpipe.netutil import free_port


class TwoAgents:
    """The running agents of one trial; every wait is bounded by the scenario's timeout."""

    def __init__(self, ctx: TrialContext, procs: list[subprocess.Popen[Any]], markers: Path) -> None:
        self.ctx = ctx
        self.procs = procs
        self.markers = markers
        self.deadline = time.monotonic() + ctx.scenario.timeout_s

    def kill_second_when_stuck(self) -> float:
        """Wait for the second node's fault marker, SIGKILL that node; the time it was lost."""
        while jobs.fault_time(self.markers) is None:
            if self.procs[1].poll() is not None:
                raise RuntimeError(f"the second agent exited ({self.procs[1].returncode}) before its fault")
            self._before_deadline("the second node's fault")
            time.sleep(0.05)
        jobs.kill_group(self.procs[1])
        return time.time()

    def wait_first(self) -> int:
        """The first agent's exit code."""
        try:
            return self.procs[0].wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise jobs.TrialTimeout(
                f"the surviving agent ran past {self.ctx.scenario.timeout_s:.0f} s"
            ) from None

    def first_log_tail(self) -> str:
        return jobs.last_line((self.ctx.work / "agent-0.log").read_text(errors="replace"))

    def _before_deadline(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise jobs.TrialTimeout(f"waited past {self.ctx.scenario.timeout_s:.0f} s for {what}")


@contextlib.contextmanager
def two_agents(ctx: TrialContext, hang_second_at: int) -> Iterator[TwoAgents]:
    """Start both agents on ``ctx.work / "run"``; both are killed on the way out."""
    job = load_config(ctx.scenario.job, jobs.job_sets(ctx, "run", ctx.work))
    job.run_dir.mkdir(parents=True, exist_ok=True)
    config = RunLayout(job.run_dir).config
    config.write_text(job.to_yaml())
    port = free_port()
    argv = [sys.executable, "-m", "hpcpipe", "launch", "agent", str(config), "--nnodes", "1:2"]
    argv += ["--nproc-per-node", str(ctx.scenario.nproc), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    argv += ["--rdzv-id", f"chaos-{ctx.scenario.name}-{ctx.trial}", "--max-restarts", "3"]
    markers = ctx.work / "markers"
    hang = {"HPCPIPE_CHAOS_HANG": f"step={hang_second_at}", "HPCPIPE_CHAOS_DIR": str(markers)}
    # The first round may form before a late second agent joins: the first node then takes no
    # step until a group with both nodes has started (else a loaded host can see the job finish).
    hold = {"HPCPIPE_CHAOS_HOLD": f"world={2 * ctx.scenario.nproc}", "HPCPIPE_CHAOS_DIR": str(markers)}
    procs: list[subprocess.Popen[Any]] = []
    logs: list[IO[bytes]] = []
    try:
        for index, env in enumerate((hold, hang)):
            logs.append((ctx.work / f"agent-{index}.log").open("wb"))
            procs.append(_start(argv, ctx.work, env, logs[-1]))
            if index == 0:  # the first agent must own the store before the second looks for it
                _wait_listening(port, procs[0], ctx.scenario.timeout_s)
        yield TwoAgents(ctx, procs, markers)
    finally:
        for proc in procs:
            jobs.kill_group(proc)
            proc.wait()
        for log in logs:
            log.close()


def _start(argv: list[str], cwd: Path, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        argv, cwd=cwd, env=jobs.hpcpipe_env(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_listening(port: int, proc: subprocess.Popen[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the first agent exited ({proc.returncode}) before its rendezvous store was up"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise jobs.TrialTimeout(f"the rendezvous store on 127.0.0.1:{port} was not up after {timeout_s:.0f} s")
