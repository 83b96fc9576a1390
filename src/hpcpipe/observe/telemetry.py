"""Every live observer of a training run behind the few calls the training loop makes.

The loop calls ``on_step`` after each step, ``on_row`` with each logged row (on every rank: the
imbalance check is a collective), ``on_eval`` with evaluation metrics, and ``close``. Events
reach the exporter through ``on_event`` (an ``EventLog`` listener). What each observer does
lives in its own module: ``prometheus`` (the exporter), ``gpu`` (NVML), ``imbalance``
(stragglers), ``trace`` (the profiler window).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcpipe.config.observe import ObserveConfig
from hpcpipe.observe.gpu import GpuCollector, GpuSampler
from hpcpipe.observe.imbalance import ImbalanceDetector
from hpcpipe.observe.metrics import EventLog
from hpcpipe.observe.nvtx import nvtx_ranges
from hpcpipe.observe.otel import step_tracer
from hpcpipe.observe.phases import PhaseListener
from hpcpipe.observe.prometheus import Exporter
from hpcpipe.observe.trace import StepProfiler

log = logging.getLogger("hpcpipe.observe")


@dataclass(frozen=True)
class RankInfo:
    """Who this process is, as the observers need it (plain values: no process-group types)."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    node: str


class Telemetry:
    def __init__(self, cfg: ObserveConfig, who: RankInfo, run_dir: Path, run: str, recipe: str, unit: str,
                 events: EventLog) -> None:  # fmt: skip
        self.who = who
        self.events = events
        labels = {"run": run, "rank": str(who.rank), "node": who.node, "recipe": recipe}
        self.exporter = Exporter(cfg.prometheus, labels, unit, who.local_rank)
        self.gpu = GpuSampler(cfg.gpu.interval_s, *_gpu_identity(who.device)) if cfg.gpu.enabled else None
        if self.gpu is not None:
            self._start_gpu(cfg, labels)
        self.exporter.start()
        self.imbalance = ImbalanceDetector(
            cfg.imbalance, who.rank, who.world_size, who.device, who.node, self._gpu_reading
        )
        self.profiler = StepProfiler(cfg.profile, who.rank, run_dir, who.device)
        # Observers of the loop's phases as they happen (observe/phases.py listeners).
        self.nvtx: PhaseListener | None = nvtx_ranges()  # None unless a profiler records NVTX
        self.tracing = step_tracer(cfg.otel, run, who.rank, who.world_size, who.node, events)  # otel.py
        self._steps_since_row = 0
        self._last_row_step = 0  # the logged row before this one: the interval starts after it
        self._last_step_end: float | None = None

    def _start_gpu(self, cfg: ObserveConfig, labels: dict[str, str]) -> None:
        assert self.gpu is not None
        if self.gpu.start():
            self.exporter.registry.register(GpuCollector(self.gpu, labels, cfg.gpu.dcgm_names))
        elif self.who.rank == 0:  # said once, by rank 0, in events.jsonl
            self.events.emit("gpu_telemetry_off", {"reason": self.gpu.off_reason})

    def _gpu_reading(self) -> tuple[float, float, float]:
        sample = self.gpu.latest if self.gpu is not None else None
        if sample is None:
            return math.nan, math.nan, math.nan

        def num(value: float | None) -> float:
            return math.nan if value is None else float(value)

        return num(sample.sm_clock_hz), num(sample.power_w), num(sample.clock_event_reasons)

    def phase_listeners(self) -> list[PhaseListener]:
        """What the trainer attaches to its ``PhaseTimer``."""
        served = self.exporter if self.exporter.port is not None else None  # says when it evaluates or saves
        window = self.profiler if self.profiler.enabled else None  # marks them in its trace
        listeners = (self.nvtx, self.tracing, served, window)
        return [listener for listener in listeners if listener is not None]

    def start(self, next_step: int) -> None:
        """Training starts (or resumes) at ``next_step``."""
        self.profiler.start(next_step)
        self._last_row_step = next_step - 1
        self._last_step_end = time.perf_counter()

    def on_step(self, items: float) -> None:
        """``items``: tokens (or samples) this rank processed in the step."""
        now = time.perf_counter()
        if self._last_step_end is not None:
            self.exporter.on_step(items, now - self._last_step_end)
        self._last_step_end = now
        self._steps_since_row += 1
        self.profiler.step()

    def after_pause(self) -> None:
        """An evaluation or checkpoint just ran: the next step's duration starts now."""
        self._last_step_end = time.perf_counter()

    def on_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """A logged training row (every rank); returns fields to add to it (imbalance, GPU)."""
        self.exporter.on_row(row, max(self._steps_since_row, 1))
        self._steps_since_row = 0
        extra: dict[str, Any] = {}
        sample = self.gpu.latest if self.gpu is not None else None
        if sample is not None and sample.util_ratio is not None:
            extra["gpu_util_ratio"] = sample.util_ratio
        step, interval_start = int(row["step"]), self._last_row_step
        self._last_row_step = step
        if self.imbalance.due(step, interval_start):
            result = self.imbalance.check(step, row)
            sustained = self.imbalance.sustained(result)
            self.exporter.on_imbalance(result.ratio, result.slowest_rank, sustained)
            extra.update(imbalance=result.ratio, slowest_rank=result.slowest_rank)
            if sustained:
                self.events.emit("imbalance", result.to_event())
                if self.who.rank == 0:
                    log.warning("%s", result.describe())
        return extra

    def on_eval(self, metrics: dict[str, float]) -> None:
        self.exporter.on_eval(metrics)

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        self.exporter.on_event(kind, fields)

    def on_oom(self, step: int) -> None:
        path = self.profiler.dump_memory(f"oom-step{step}")
        if path is not None:
            log.warning("rank %d: memory snapshot at the out-of-memory error: %s", self.who.rank, path)

    def close(self, summary: dict[str, float] | None = None) -> None:
        if self.tracing is not None:  # first: its closing event still reaches the exporter
            self.tracing.close()
        self.profiler.close()
        if self.gpu is not None:
            self.gpu.stop()
        self.exporter.close(summary if self.who.rank == 0 else None)


def _gpu_identity(device: torch.device) -> tuple[int | None, str | None]:
    """(index, NVML UUID) of this rank's CUDA device; (None, None) on CPU."""
    if device.type != "cuda":
        return None, None
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"
    return index, uuid or None
