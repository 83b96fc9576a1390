"""Hang detection: a stuck process really exits with stacks on disk; beats and pauses keep it alive.

Also the chaos faults that end a process (hang, SIGKILL), which only a subprocess can show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpcpipe.observe.watchdog import HANG_EXIT_CODE, HangReport, Watchdog

# A worker that completes step 7 and then hangs inside the chaos injector.
HANGING_WORKER = """
import os, sys
from pathlib import Path
from hpcpipe.chaos import maybe_inject
from hpcpipe.observe.watchdog import Watchdog

watchdog = Watchdog(timeout_s=float(sys.argv[2]), run_dir=Path(sys.argv[1]), rank=3).start()
print("pid", os.getpid(), flush=True)
for step in range(1, 9):
    maybe_inject(step, rank=3)  # HPCPIPE_CHAOS_HANG=step=8,rank=3
    watchdog.beat(step)
    print("done", step, flush=True)
"""


def _run(code: str, *args: str, env: dict[str, str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_hung_process_dumps_its_stacks_and_exits(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = _run(HANGING_WORKER, str(tmp_path), "1.0", env={"HPCPIPE_CHAOS_HANG": "step=8,rank=3"})
    elapsed = time.monotonic() - t0
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr
    assert elapsed < 10
    assert proc.stdout.split("\n")[-2] == "done 7"
    assert "watchdog: rank 3 made no progress for 1." in proc.stderr
    assert "after step 7" in proc.stderr
    dump = (tmp_path / "hang-rank3.txt").read_text()
    assert dump.startswith("=== hang: rank 3, last completed step 7, no progress for 1.")
    pid = int(proc.stdout.split()[1])
    assert f", pid {pid}, " in dump
    assert "= MainThread" in dump and "= hpcpipe-watchdog-rank3" in dump
    assert "in _chaos_hang_forever" in dump  # the stuck function, from the main thread's stack
    assert "in <module>" in dump
    (event,) = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert (event["event"], event["rank"], event["step"], event["pid"]) == ("hang", 3, 7, pid)
    assert event["stalled_s"] >= 1.0 and event["stack_file"] == "hang-rank3.txt"


def test_beats_and_pauses_keep_it_alive_then_it_fires(tmp_path: Path) -> None:
    reports: list[HangReport] = []
    fired = threading.Event()

    def on_hang(report: HangReport) -> None:
        reports.append(report)
        fired.set()

    # A 1 s timeout against beats 0.05 s apart: a busy machine may stall this thread for
    # a few hundred milliseconds without it meaning a hang.
    with Watchdog(1.0, tmp_path, rank=1, on_hang=on_hang) as watchdog:
        for step in range(1, 11):  # 0.5 s of regular progress
            time.sleep(0.05)
            watchdog.beat(step)
        with watchdog.pause():  # a checkpoint save longer than the timeout
            time.sleep(1.2)
            with watchdog.pause():  # nested: an evaluation inside it
                time.sleep(0.1)
        assert not fired.is_set()
        assert fired.wait(4)  # no beat after the pause
    (report,) = reports
    assert (report.rank, report.step, report.pid) == (1, 10, os.getpid())
    assert 1.0 <= report.stalled_s < 3.0
    assert report.stack_file == tmp_path / "hang-rank1.txt"
    assert "test_beats_and_pauses_keep_it_alive_then_it_fires" in report.stack_file.read_text()


def test_disabled_with_a_zero_timeout(tmp_path: Path) -> None:
    watchdog = Watchdog(0, tmp_path, rank=0, on_hang=lambda report: None).start()
    time.sleep(0.1)
    assert not watchdog.enabled and not watchdog.fired
    assert not any(t.name.startswith("hpcpipe-watchdog") for t in threading.enumerate())
    watchdog.stop()
    assert list(tmp_path.iterdir()) == []


def test_stop_ends_the_thread(tmp_path: Path) -> None:
    watchdog = Watchdog(0.2, tmp_path, rank=2, on_hang=lambda report: None).start()
    watchdog.stop()
    time.sleep(0.4)
    assert not watchdog.fired
    assert not any(t.name == "hpcpipe-watchdog-rank2" for t in threading.enumerate())


KILLED_WORKER = """
from hpcpipe.chaos import maybe_inject
for step in range(1, 10):
    maybe_inject(step, rank=1)
print("finished", flush=True)
"""


def test_chaos_kill_fires_once_per_marker_directory(tmp_path: Path) -> None:
    env = {"HPCPIPE_CHAOS_KILL": "step=7,rank=1", "HPCPIPE_CHAOS_DIR": str(tmp_path)}
    first = _run(KILLED_WORKER, env=env)
    assert first.returncode == -9  # SIGKILL: no chance to clean up, like a lost node
    assert "chaos: KILL on rank 1 at step 7" in first.stderr
    restarted = _run(KILLED_WORKER, env=env)  # the elastic restart inherits the environment
    assert restarted.returncode == 0 and restarted.stdout == "finished\n"
    assert [p.name for p in tmp_path.iterdir()] == ["kill-rank1-step7.fired"]
