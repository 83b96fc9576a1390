"""Per-rank hang detection: no step progress within a timeout dumps every stack and exits.

A hung rank (a deadlocked collective, a dead NFS mount, a stuck data worker) otherwise holds the
whole job until the process-group timeout, and then dies without saying where it was. The
watchdog is a daemon thread per rank: the training loop calls ``beat(step)`` after every step;
when no beat came for ``timeout_s`` it

1. writes a header (rank, step, seconds since the last progress, host, pid, thread names) and
   every thread's Python stack (``faulthandler``, which needs no cooperation from the stuck
   thread) to ``run_dir/hang-rank<rank>.txt`` (appended: restarts keep earlier dumps),
2. appends a ``hang`` event to ``events.jsonl`` (every rank writes its own line: small
   ``O_APPEND`` writes of whole lines do not interleave),
3. prints one line naming the rank and the step to stderr,
4. ``os._exit(HANG_EXIT_CODE)``: the elastic agent sees a failed worker, tears the group down
   and restarts it from the last checkpoint. ``os._exit`` because the main thread is stuck and a
   normal exit would wait for it.

Set ``timeout_s`` below the process-group timeout (``parallel.timeout_s``), so the watchdog
fires, with stacks, before a collective times out without them. Known long phases (checkpoint
save, evaluation) go inside ``with watchdog.pause():``; a long phase that must still end (the
first compiled step) inside ``with watchdog.allowing(seconds):``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import append_event
from hpcpipe.observe.peers import PeerBeats

HANG_EXIT_CODE = 3
"""Distinct from 1 (an uncaught exception), 2 (a user error), 75 (preempted after a checkpoint)
and 128 + N (killed by signal N), so a failed rank's exit code alone says "it hung"."""


@dataclass(frozen=True)
class HangReport:
    rank: int
    step: int  # the last step that completed (``beat``)
    stalled_s: float  # seconds since the last progress
    stack_file: Path | None  # None when the dump could not be written
    host: str
    pid: int
    peers: str | None = None  # the peers behind or silent (hpcpipe.observe.peers), when known


class Watchdog:
    """Fires once when ``beat`` was not called for ``timeout_s`` (disabled when ``timeout_s <= 0``).

    ``on_hang``: called (from the watchdog thread) with the report instead of exiting; for tests
    and embedding. By default the process exits with ``exit_code``. ``peers``: the group's
    progress (see ``hpcpipe.observe.peers``), so the report names a stuck or stopped peer too.
    """

    def __init__(
        self,
        timeout_s: float,
        run_dir: Path,
        rank: int,
        on_hang: Callable[[HangReport], None] | None = None,
        *,
        exit_code: int = HANG_EXIT_CODE,
        peers: PeerBeats | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.run_dir = run_dir
        self.rank = rank
        self.on_hang = on_hang
        self.exit_code = exit_code
        self.peers = peers
        self.enabled = timeout_s > 0
        self.fired = False
        self._last_beat = time.monotonic()
        self._step = 0
        self._paused = 0  # nesting depth of pause()
        self._allowed = 0.0  # a longer timeout for the phase in progress (allowing())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Poll often enough to fire within ~10% of the timeout, but never busy-wait.
        self._poll_s = min(1.0, max(0.02, timeout_s / 10))

    def start(self) -> Watchdog:
        """Start the watchdog thread; the timeout counts from now."""
        if self.enabled and self._thread is None:
            self._last_beat = time.monotonic()
            self._thread = threading.Thread(
                target=self._run, name=f"hpcpipe-watchdog-rank{self.rank}", daemon=True
            )
            self._thread.start()
            if self.peers is not None:
                self.peers.start()
        return self

    def beat(self, step: int) -> None:
        """Record progress: ``step`` completed now (two attribute stores; call it every step)."""
        self._step = step
        self._last_beat = time.monotonic()
        if self.peers is not None:
            self.peers.step = step

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Suspend detection for a known long phase; the timeout restarts when it ends."""
        self._paused += 1
        try:
            yield
        finally:
            # The clock first: a check between the two would see the pause over and the beat
            # from before it, and end a healthy run after any pause longer than the timeout.
            self._last_beat = time.monotonic()
            self._paused -= 1

    @contextlib.contextmanager
    def allowing(self, seconds: float) -> Iterator[None]:
        """A phase known to be long but not endless (compiling): the timeout is ``seconds`` while
        it runs, so a hang inside it is still caught, later; it restarts when it ends."""
        self._allowed = seconds
        try:
            yield
        finally:
            self._last_beat = time.monotonic()
            self._allowed = 0.0

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        if self.peers is not None:
            self.peers.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the watchdog thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            if self._paused:
                continue
            stalled = time.monotonic() - self._last_beat
            if stalled >= max(self.timeout_s, self._allowed):
                self._fire(stalled)
                return

    def _fire(self, stalled: float) -> None:
        self.fired = True
        peers = self.peers.suspects() if self.peers is not None else None
        report = HangReport(
            rank=self.rank,
            step=self._step,
            stalled_s=round(stalled, 3),
            stack_file=self._dump_stacks(stalled, peers),
            host=socket.gethostname(),
            pid=os.getpid(),
            peers=peers,
        )
        with contextlib.suppress(OSError):  # a full or read-only disk must not keep a hung job alive
            append_event(
                self.run_dir,
                "hang",
                rank=report.rank,
                step=report.step,
                stalled_s=report.stalled_s,
                timeout_s=self.timeout_s,
                host=report.host,
                pid=report.pid,
                stack_file=None if report.stack_file is None else report.stack_file.name,
                peers=peers,
            )
        action = "calling on_hang" if self.on_hang is not None else f"exiting with code {self.exit_code}"
        print(
            f"watchdog: rank {self.rank} made no progress for {stalled:.1f} s after step {report.step} "
            f"(timeout {self.timeout_s:g} s); stacks in {report.stack_file}; {action}"
            + ("" if peers is None else f"; peers: {peers}"),
            file=sys.stderr,
            flush=True,
        )
        if self.on_hang is not None:
            self.on_hang(report)
            return
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(self.exit_code)

    def _dump_stacks(self, stalled: float, peers: str | None) -> Path | None:
        path = RunLayout(self.run_dir).hang_dump(self.rank)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(_header(self.rank, self._step, stalled, self.timeout_s, peers))
                f.flush()  # faulthandler writes to the file descriptor, past Python's buffer
                faulthandler.dump_traceback(file=f, all_threads=True)
                f.write("\n")
        except OSError:
            return None
        return path


def _header(rank: int, step: int, stalled: float, timeout_s: float, peers: str | None) -> str:
    """Who hung and where; faulthandler names threads only by id, so map ids to names."""
    lines = [
        f"=== hang: rank {rank}, last completed step {step}, no progress for {stalled:.1f} s "
        f"(timeout {timeout_s:g} s), host {socket.gethostname()}, pid {os.getpid()}, "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} ===",
    ]
    if peers is not None:
        lines.append(f"peers behind or silent: {peers}")
    for thread in threading.enumerate():
        if thread.ident is not None:
            lines.append(f"thread 0x{thread.ident:016x} = {thread.name}")
    return "\n".join(lines) + "\n\n"
