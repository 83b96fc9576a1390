"""Where each step's time goes (forward, backward, optimizer, exposed communication), and the one
place that tells profilers and tracers which phase the loop is in.

The training loop calls ``begin(phase)`` when a phase starts; the time until the next ``begin``
(or ``end_step``) belongs to that phase. Phases: ``data`` (host time loading a micro-batch; the
row reports it separately as ``data_time_s``), ``forward``, ``comm``, ``backward``, ``optimizer``.
``comm`` is exposed communication, time spent waiting for other ranks:

- the OOM guard's agreement all-reduce between forward and backward (every strategy);
- under DDP, the gradient all-reduce that backward compute did not hide: a communication hook
  calls ``compute_done()`` when the last gradient bucket is handed to the all-reduce, backward
  compute is over there, and closing ``backward`` splits its span at that mark.

Under FSDP2 and DeepSpeed the all-gathers and reduce-scatters have no such hook: their waits stay
inside forward and backward, and ``comm`` is a lower bound.

On CPU a mark is ``time.perf_counter()``. On CUDA it is a ``torch.cuda.Event`` recorded on the
current stream: the host runs ahead of the GPU, so only the stream's timeline says how long a
phase took on the device. Events are read once per logging interval, after the loop's
synchronisation at the logged step, so marking adds no synchronisation.

**Listeners** (NVTX ranges, OpenTelemetry spans) see every phase and step boundary as it happens,
and the loop's other named regions (``region("checkpoint_save")``, a collective) nested inside.
They see DDP's backward as one ``backward`` phase: ``compute_done()`` comes from the autograd
thread and marks the device timeline, which a listener on the training thread cannot split at.
With no listener attached a boundary costs one empty loop.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import torch

PHASES = ("forward", "backward", "optimizer", "comm")
"""Row keys ``<phase>_time_s``: per-step means over the logging interval."""


class PhaseListener:
    """Told of every step and phase boundary, on the training thread. Override what you need."""

    def step_begin(self, step: int) -> None:
        """Training step ``step`` (1-based) starts."""

    def step_end(self, step: int) -> None:
        """Step ``step`` is over (its optimizer update was issued)."""

    def phase_begin(self, phase: str) -> None:
        """A phase or a nested region starts."""

    def phase_end(self, phase: str) -> None:
        """The phase or region begun last ends (phases never overlap; regions nest)."""


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.listeners: list[PhaseListener] = []
        self._spans: dict[str, list[tuple[object, object]]] = defaultdict(list)
        self._phase: str | None = None
        self._mark: object | None = None
        self._compute_done: object | None = None
        self._step = 0
        self._steps = 0

    def _now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin_step(self, step: int) -> None:
        self._step = step
        for listener in self.listeners:
            listener.step_begin(step)

    def begin(self, phase: str) -> None:
        """``phase`` starts now; the phase before it (if any) ends here."""
        now = self._now()
        self._close(now)
        self._phase, self._mark = phase, now
        if phase == "backward":
            self._compute_done = None
        for listener in self.listeners:
            listener.phase_begin(phase)

    def compute_done(self) -> None:
        """Backward compute is over (called from the autograd thread by the DDP hook)."""
        self._compute_done = self._now()

    def end_step(self) -> None:
        """The open phase and the step end."""
        self._close(self._now())
        self._steps += 1
        for listener in self.listeners:
            listener.step_end(self._step)

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """A named region for the listeners only (a checkpoint save, a collective); not timed here."""
        if not self.listeners:
            yield
            return
        for listener in self.listeners:
            listener.phase_begin(name)
        try:
            yield
        finally:
            for listener in reversed(self.listeners):
                listener.phase_end(name)

    def _close(self, now: object) -> None:
        phase, start = self._phase, self._mark
        if phase is None or start is None:
            return
        done = self._compute_done if phase == "backward" else None
        if done is not None:
            self._spans["backward"].append((start, done))
            self._spans["comm"].append((done, now))
            self._compute_done = None
        else:
            self._spans[phase].append((start, now))
        self._phase = self._mark = None
        for listener in reversed(self.listeners):
            listener.phase_end(phase)

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
