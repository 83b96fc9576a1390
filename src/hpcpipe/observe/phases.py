"""Where each step's time goes: forward, backward, optimizer and exposed communication.

The training loop calls ``lap(phase)`` after each phase: the time since the previous mark is
added to that phase. ``comm`` is exposed communication, time spent waiting for other ranks:

- the OOM guard's agreement all-reduce between forward and backward (every strategy);
- under DDP, the gradient all-reduce that backward compute did not hide: a communication hook
  calls ``compute_done()`` when the last gradient bucket is handed to the all-reduce, backward
  compute is over there, and the next ``lap("backward")`` splits its span at that mark.

Under FSDP2 the all-gathers and reduce-scatters have no such hook: their waits stay inside
forward and backward, and ``comm`` is a lower bound.

On CPU a mark is ``time.perf_counter()``. On CUDA it is a ``torch.cuda.Event`` recorded on the
current stream: the host runs ahead of the GPU, so only the stream's timeline says how long a
phase took on the device. Events are read once per logging interval, after the loop's
synchronisation at the logged step, so marking adds no synchronisation. Data-loading time is
measured separately (``data_time_s``): it is host time, and the loop already takes it.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

PHASES = ("forward", "backward", "optimizer", "comm")
"""Row keys ``<phase>_time_s``: per-step means over the logging interval."""


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._spans: dict[str, list[tuple[object, object]]] = defaultdict(list)
        self._mark: object | None = None
        self._compute_done: object | None = None
        self._steps = 0

    def _now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        """Mark the start of the next phase (after data loading, or at a step's start)."""
        self._mark = self._now()
        self._compute_done = None

    def compute_done(self) -> None:
        """Backward compute is over (called from the autograd thread by the DDP hook)."""
        self._compute_done = self._now()

    def lap(self, phase: str) -> None:
        """The time since the last mark belongs to ``phase``; a new mark starts."""
        now = self._now()
        if self._mark is None:
            self._mark = now
            return
        done = self._compute_done if phase == "backward" else None
        if done is not None:
            self._spans["backward"].append((self._mark, done))
            self._spans["comm"].append((done, now))
            self._compute_done = None
        else:
            self._spans[phase].append((self._mark, now))
        self._mark = now

    def end_step(self) -> None:
        self._steps += 1

    def read(self) -> dict[str, float | None]:
        """Per-step mean seconds of each phase since the last read (device synchronised on CUDA)."""
        steps = max(self._steps, 1)
        if self.cuda:
            torch.cuda.synchronize()
        row: dict[str, float | None] = {}
        for phase in PHASES:
            total = sum(self._elapsed(a, b) for a, b in self._spans.get(phase, ()))
            row[f"{phase}_time_s"] = total / steps
        self._spans.clear()
        self._steps = 0
        return row

    def _elapsed(self, start: object, end: object) -> float:
        if isinstance(start, float) and isinstance(end, float):
            return end - start
        assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
        return start.elapsed_time(end) / 1000.0  # milliseconds on the stream's timeline
