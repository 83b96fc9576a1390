"""Each rank's progress in the process group's store, so a rank whose watchdog fires can name
the rank that stopped, not only itself.

A rank that waits in a collective for a stuck peer hangs too, and its own stack shows only the
collective. A peer stuck in Python still publishes (its publisher thread runs) with an older
step; a peer that is SIGSTOPped, swapped out or dead publishes nothing. Both are named:

    rank 1 silent for 4.4 s (last published: step 6); rank 2 behind, at step 15

Publications are periodic, so "last published" may trail the step a silent rank reached.

Publishing runs on its own daemon thread, every ``interval_s``, off the training thread. Reads
happen only when a watchdog fires, and are bounded: when rank 0 itself is stopped, the store it
serves does not answer either, and that is the answer.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

KEY = "hpcpipe/progress/{rank}"


@dataclass(frozen=True)
class PeerState:
    rank: int
    step: int | None  # None: never published
    silent_s: float | None  # seconds since its last publication (None: never)

    def describe(self, stale_s: float) -> str:
        if self.step is None or self.silent_s is None:
            return f"rank {self.rank} never published"
        if self.silent_s > stale_s:
            return f"rank {self.rank} silent for {self.silent_s:.1f} s (last published: step {self.step})"
        return f"rank {self.rank} behind, at step {self.step}"


class PeerBeats:
    """Publish this rank's last step; on demand, the peers that are behind or silent."""

    def __init__(self, store: Any, rank: int, world_size: int, interval_s: float) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.interval_s = interval_s
        self.step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and self.world_size > 1:
            self._thread = threading.Thread(target=self._publish_loop, name="hpcpipe-peer-beats", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # not joined: a publish blocked on a dead store must not block exit

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            value = json.dumps({"step": self.step, "time": time.time()})
            try:
                self.store.set(KEY.format(rank=self.rank), value)
            except Exception:  # the store is gone (the group is ending): stop publishing
                return
            self._stop.wait(self.interval_s)

    def suspects(self, timeout_s: float = 3.0) -> str:
        """One line naming the peers that are behind or silent, read with a bounded wait."""
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self._read_suspects()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            silent = f"the store (served by rank 0) did not answer within {timeout_s:g} s"
            return f"{silent}: rank 0 is stuck or stopped"
        return found[0]

    def _read_suspects(self) -> str:
        try:
            return self._lagging_peers()
        except Exception as exc:  # an unreadable board is not a stopped rank 0
            return f"peers unreadable ({type(exc).__name__}: {exc})"

    def _lagging_peers(self) -> str:
        now = time.time()
        states = [_read(self.store, rank, now) for rank in range(self.world_size) if rank != self.rank]
        stale_s = 3 * self.interval_s
        lagging = _lagging(states, self.step, stale_s)
        return (
            "; ".join(s.describe(stale_s) for s in lagging)
            if lagging
            else "every peer is at this rank's step"
        )


def _read(store: Any, rank: int, now: float) -> PeerState:
    key = KEY.format(rank=rank)
    try:
        if not store.check([key]):
            return PeerState(rank, None, None)
        value = json.loads(store.get(key))
        return PeerState(rank, int(value["step"]), round(now - float(value["time"]), 1))
    except Exception:  # absent, or not what a PeerBeats wrote: as good as never published
        return PeerState(rank, None, None)


def _lagging(states: list[PeerState], my_step: int, stale_s: float) -> list[PeerState]:
    """Peers behind ``my_step`` or silent for longer than ``stale_s``, the most suspicious first."""

    def suspicious(s: PeerState) -> bool:
        return s.step is None or s.step < my_step or (s.silent_s is not None and s.silent_s > stale_s)

    def most_suspicious_first(s: PeerState) -> tuple[float, int]:
        return (
            -(s.silent_s if s.silent_s is not None else float("inf")),
            s.step if s.step is not None else -1,
        )

    return sorted((s for s in states if suspicious(s)), key=most_suspicious_first)


def peer_beats(rank: int, world_size: int, hang_timeout_s: float) -> PeerBeats | None:
    """The group's progress board for a watchdog of ``hang_timeout_s`` (None: single rank, or
    no watchdog). Published ten times per timeout, at most once a second."""
    if hang_timeout_s <= 0 or world_size < 2:
        return None
    from hpcpipe.compat import TorchAPIError, default_store

    try:
        store = default_store()
    except (TorchAPIError, ValueError) as exc:  # a diagnostic must never stop training
        print(f"watchdog: hang reports will not name peers ({exc})", file=sys.stderr, flush=True)
        return None
    return PeerBeats(store, rank, world_size, interval_s=min(1.0, max(0.2, hang_timeout_s / 10)))
