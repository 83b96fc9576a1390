"""The longest silence between an elastic agent's rendezvous heartbeats while its node works: the
margin behind the heartbeat of agents on one host (``launch/agent.py``: ``LOCAL_KEEP_ALIVE_S`` x
``KEEP_ALIVE_MISSES`` of silence and a node counts as lost).

Two local agents (``hpcpipe launch agent --nnodes 2``, one worker each, as the lost-node chaos
scenario runs them) train the tiny GPT with a checkpoint every 2 steps for ``--seconds``, while
``--hogs`` processes spin on the CPU at normal priority; every ``--kill-every`` seconds one worker is
SIGKILLed, so both agents also tear their groups down, rendezvous and start new workers. Each
agent logs the moment it stamps a heartbeat into the rendezvous state (torch's own debug record,
"updated its keep-alive heartbeat time"); the gaps between one agent's stamps are the silences
the other agent sees. The verdict: the longest gap against the silence that loses a node.

    .venv/bin/python benchmarks/rdzv_heartbeat_gaps.py [--seconds 120] [--hogs 2] [--kill-every 20]
        [--keep-alive 0.5] [--misses 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import emit, parse_with_smoke
from hpcpipe.chaos.jobs import descendants, hpcpipe_env, kill_group
from hpcpipe.config import load_config
from hpcpipe.launch import zygote
from hpcpipe.layout import RunLayout
from hpcpipe.netutil import free_port

STAMP = "updated its keep-alive heartbeat time"
# Runs in each agent before hpcpipe's CLI: torch's rendezvous logger writes every heartbeat stamp,
# with its wall-clock time, to the file named by the first argument.
BOOT = f"""
import logging, runpy, sys
handler = logging.FileHandler(sys.argv.pop(1))
handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
handler.addFilter(lambda record: {STAMP!r} in record.getMessage())
log = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
log.addHandler(handler)
log.setLevel(logging.DEBUG)
log.propagate = False
sys.argv[0] = "hpcpipe"
runpy.run_module("hpcpipe", run_name="__main__", alter_sys=True)
"""


def _spin() -> None:
    while True:
        pass


def _run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    prepared = work / "prepared"
    sets = [
        f"run.out_dir={work}",
        f"data.prepared_dir={prepared}",
        "observe.log_every=1",
        "observe.progress=false",
        "parallel.strategy=ddp",
    ]
    prep = ["train", "tiny", "--set", "run.name=prepare", "--set", "train.steps=1"]
    prep += [a for s in sets for a in ("--set", s)]
    # Forked from this process's zygote (torch imported once): a one-step run that prepares the data.
    zygote.prestart()
    done = zygote.run_hpcpipe(prep, work, hpcpipe_env())
    if done.returncode != 0:
        raise RuntimeError(f"preparing the data failed:\n{done.stderr[-3000:]}")
    job = load_config(
        "tiny",
        [
            *sets,
            "run.name=gaps",
            "train.steps=1000000",
            "checkpoint.every_steps=2",
            f"parallel.rdzv_keep_alive_s={args.keep_alive}",
            f"parallel.rdzv_keep_alive_misses={args.misses}",
        ],
    )
    job.run_dir.mkdir(parents=True, exist_ok=True)
    config = RunLayout(job.run_dir).config
    config.write_text(job.to_yaml())
    port = free_port()
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    agents: list[subprocess.Popen[Any]] = []
    loads: list[float] = []
    kills = 0
    try:
        for index in range(2):
            argv = [sys.executable, "-c", BOOT, str(work / f"stamps-{index}.log"), "launch", "agent"]
            argv += [str(config), "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1000"]
            argv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "heartbeat-gaps"]
            with (work / f"agent-{index}.log").open("wb") as log:
                agents.append(_start(argv, work, log))
            if index == 0:
                _wait_listening(port, agents[0])
        _wait_training(job.run_dir / "metrics.jsonl", agents)  # both nodes in one group
        started = time.monotonic()
        next_kill = started + args.kill_every
        while time.monotonic() - started < args.seconds:
            time.sleep(1.0)
            loads.append(os.getloadavg()[0])
            for agent in agents:
                if agent.poll() is not None:
                    raise RuntimeError(f"an agent exited ({agent.returncode}): see {work}/agent-*.log")
            if args.kill_every and time.monotonic() >= next_kill:
                kills += _kill_a_worker(agents[kills % 2].pid)
                next_kill += args.kill_every
    finally:
        for agent in agents:
            kill_group(agent)
            agent.wait()
        for hog in hogs:
            hog.kill()
            hog.join()
    return {"loads": loads, "kills": kills, "agents": [_gaps(work / f"stamps-{i}.log") for i in range(2)]}


def _start(argv: list[str], work: Path, log: Any) -> subprocess.Popen[Any]:
    env = hpcpipe_env()
    return subprocess.Popen(
        argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_listening(port: int, proc: subprocess.Popen[Any], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the first agent exited ({proc.returncode}) before its store was up")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"no rendezvous store on 127.0.0.1:{port} after {timeout_s:.0f} s")


def _wait_training(metrics: Path, agents: list[subprocess.Popen[Any]], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(agent.poll() is not None for agent in agents):
            raise RuntimeError("an agent exited before training started: see the agents' logs")
        if metrics.is_file() and '"loss"' in metrics.read_text():
            return
        time.sleep(0.5)
    raise RuntimeError(f"no training step after {timeout_s:.0f} s")


def _kill_a_worker(agent: int) -> int:
    """SIGKILL one worker of ``agent`` (a process two levels down: the fork server's child)."""
    tree = set(descendants(agent))
    for pid in sorted(tree):
        with contextlib.suppress(OSError):
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent in tree:
                os.kill(pid, signal.SIGKILL)
                return 1
    return 0


def _gaps(path: Path) -> list[float]:
    stamps = [float(line.split(" ", 1)[0]) for line in path.read_text().splitlines() if STAMP in line]
    return [b - a for a, b in itertools.pairwise(stamps)]


def _p99(gaps: list[float]) -> float:
    return statistics.quantiles(gaps, n=100, method="inclusive")[-1] if len(gaps) > 1 else gaps[0]


def main(argv: list[str] | None = None) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the agents train")
    parser.add_argument("--hogs", type=int, default=2, help="processes spinning on the CPU meanwhile")
    parser.add_argument("--kill-every", type=float, default=20.0, help="SIGKILL a worker this often (0: no)")
    parser.add_argument("--keep-alive", type=float, default=0.5, help="parallel.rdzv_keep_alive_s")
    parser.add_argument("--misses", type=int, default=3, help="parallel.rdzv_keep_alive_misses")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one)")
    args = parse_with_smoke(parser, {"seconds": 3.0, "hogs": 0, "kill_every": 0.0}, argv)
    with contextlib.ExitStack() as stack:
        work = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hb-gaps-")))
        work.mkdir(parents=True, exist_ok=True)
        found = _run(args, work)
    gaps, loads = [g for agent in found["agents"] for g in agent], found["loads"]
    if not gaps:
        raise SystemExit("no heartbeat was logged: see the agents' logs")
    lost_after = args.keep_alive * args.misses
    longest = max(gaps)
    print(f"heartbeat every {args.keep_alive} s, lost after {lost_after:.2f} s of silence")
    print(f"{'agent':<8}{'beats':>8}{'median gap':>12}{'p99':>8}{'max':>8}")
    for index, agent in enumerate(found["agents"]):
        if agent:
            med, top = statistics.median(agent), max(agent)
            print(f"{index:<8}{len(agent) + 1:>8}{med:>12.3f}{_p99(agent):>8.3f}{top:>8.3f}")
    print(f"load average (1 min) median {statistics.median(loads):.1f}, max {max(loads):.1f}")
    share = longest / lost_after
    print(f"workers killed: {found['kills']}; longest gap {longest:.3f} s ({share:.2f} of the limit)")
    emit(
        {
            "benchmark": "rdzv_heartbeat_gaps",
            "keep_alive_s": args.keep_alive,
            "misses": args.misses,
            "lost_after_s": lost_after,
            "seconds": args.seconds,
            "hogs": args.hogs,
            "workers_killed": found["kills"],
            "beats": len(gaps) + len(found["agents"]),
            "median_gap_s": round(statistics.median(gaps), 4),
            "p99_gap_s": round(_p99(gaps), 4),
            "max_gap_s": round(longest, 4),
            "load_median": round(statistics.median(loads), 2),
            "load_max": round(max(loads), 2),
        }
    )


if __name__ == "__main__":
    main()
