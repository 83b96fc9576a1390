"""The progress board a firing watchdog reads to name a stuck or stopped peer, on a real c10d
store (HashStore, in-process), and bounded when the store itself does not answer."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch.distributed as dist

from hpcpipe.observe.peers import KEY, PeerBeats
from hpcpipe.observe.watchdog import HangReport, Watchdog


def _publish(store: dist.Store, rank: int, step: int, age_s: float) -> None:
    store.set(KEY.format(rank=rank), json.dumps({"step": step, "time": time.time() - age_s}))


def test_peers_behind_or_silent_are_named_the_silent_first() -> None:
    store = dist.HashStore()
    _publish(store, 1, step=7, age_s=0.1)  # in step, alive: not named
    _publish(store, 2, step=6, age_s=0.1)  # behind
    _publish(store, 3, step=7, age_s=9.0)  # silent: stopped or dead
    beats = PeerBeats(store, rank=0, world_size=5, interval_s=1.0)
    beats.step = 7
    line = beats.suspects()
    assert line.startswith("rank 4 never published; rank 3 silent for 9.0 s (last published: step 7)")
    assert line.endswith("; rank 2 behind, at step 6") and "rank 1 " not in line


def test_a_store_that_does_not_answer_names_rank_0_within_the_bound() -> None:
    class Frozen:  # rank 0, which serves the store, is SIGSTOPped: every request waits
        def check(self, keys: list[str]) -> bool:
            time.sleep(30)
            return True

    beats = PeerBeats(Frozen(), rank=1, world_size=2, interval_s=0.2)
    started = time.monotonic()
    line = beats.suspects(timeout_s=0.5)
    assert time.monotonic() - started < 2
    assert "did not answer" in line and "rank 0" in line


def test_the_watchdog_publishes_its_step_and_names_a_silent_peer(tmp_path: Path) -> None:
    store = dist.HashStore()
    _publish(store, 1, step=2, age_s=0.0)  # a peer that published once, then froze
    reports: list[HangReport] = []
    fired = threading.Event()

    def on_hang(report: HangReport) -> None:
        reports.append(report)
        fired.set()

    beats = PeerBeats(store, rank=0, world_size=2, interval_s=0.05)
    with Watchdog(0.6, tmp_path, rank=0, on_hang=on_hang, peers=beats) as watchdog:
        for step in (1, 2, 3):
            watchdog.beat(step)
            time.sleep(0.05)
        # Published off-thread every interval_s: on a loaded machine the thread may run late.
        deadline = time.monotonic() + 5
        while json.loads(store.get(KEY.format(rank=0)))["step"] != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(store.get(KEY.format(rank=0)))["step"] == 3
        assert fired.wait(5)
    (report,) = reports
    assert report.peers is not None and report.peers.startswith("rank 1 silent for")
    assert report.peers.endswith("(last published: step 2)")
    assert f"peers behind or silent: {report.peers}" in (tmp_path / "hang-rank0.txt").read_text()
    event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "hang" and event["peers"] == report.peers
