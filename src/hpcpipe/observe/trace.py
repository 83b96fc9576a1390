"""A torch.profiler window over chosen training steps, one Chrome/Perfetto trace per rank.

``observe.profile`` names the window in trainer steps: ``warmup`` steps traced and discarded,
then ``active`` steps recorded from ``start_step`` on. The trace lands in
``<run_dir>/profile/rank<R>.steps<A>-<B>.trace.json`` (open it in Perfetto or chrome://tracing;
``hpcpipe profile RUN_DIR`` reads it). With ``memory`` on CUDA the allocator history is recorded
over the window and dumped next to the trace as ``rank<R>.memory.pickle`` (pytorch.org/
memory_viz). The allocator history keeps recording until the run ends, so an out-of-memory
error dumps one too (``rank<R>.oom-step<N>.pickle``), whenever it happens. After the window the
profiler itself is stopped, so the rest of the run pays nothing for it.

With ``tool: nsys`` or ``ncu`` the worker already runs under Nsight Systems or Nsight Compute (the
launcher starts it so: ``launch/nsight.py``), which waits for the CUDA profiler API: here the
window is ``cudaProfilerStart`` before step ``start_step`` and ``cudaProfilerStop`` after step
``start_step + active - 1`` (no warm-up: the tool discards nothing). On CPU there is no CUDA
context and nothing to capture: the calls are skipped, the window's bookkeeping is the same.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from hpcpipe import compat
from hpcpipe.config.observe import ProfileConfig
from hpcpipe.layout import RunLayout
from hpcpipe.observe.phases import PhaseListener
from hpcpipe.observe.regions import ANNOTATION, LONG_PHASES

log = logging.getLogger("hpcpipe.observe.trace")


def trace_dir(run_dir: Path) -> Path:
    return RunLayout(run_dir).profile


class StepProfiler(PhaseListener):
    """The window; as the trainer's phase listener it marks evaluations and checkpoint saves
    that fall inside it, which ``hpcpipe profile`` leaves out of the traced steps."""

    def __init__(self, cfg: ProfileConfig | None, rank: int, run_dir: Path, device: torch.device) -> None:
        self.cfg = cfg
        self.rank = rank
        self.out = trace_dir(run_dir)
        self.cuda = device.type == "cuda"
        self.enabled = cfg is not None and cfg.records(rank)
        self._prof: Any = None
        self._left = 0  # profiler steps until the window is over
        self.trace_path: Path | None = None
        self._next_step = 0  # nsys/ncu: the step that runs next
        self._capturing = False
        self._marks: list[Any] = []  # open record_function ranges of long phases

    def phase_begin(self, phase: str) -> None:
        if self._prof is not None and phase in LONG_PHASES:
            mark = torch.profiler.record_function(ANNOTATION.format(phase=phase))
            mark.__enter__()
            self._marks.append(mark)

    def phase_end(self, phase: str) -> None:
        if self._marks and phase in LONG_PHASES:
            self._marks.pop().__exit__(None, None, None)

    def start(self, next_step: int) -> None:
        """Arm the window; ``next_step`` is the first step this process will run."""
        cfg = self.cfg
        if not self.enabled or cfg is None:
            return
        first = cfg.start_step - cfg.warmup  # first traced step
        last = cfg.start_step + cfg.active - 1
        if next_step > cfg.start_step:
            log.warning("observe.profile: the run resumed at step %d, after the window's start", next_step)
            return
        if cfg.tool != "torch":
            self._next_step = next_step
            self._capture_if_due()
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.out.mkdir(parents=True, exist_ok=True)
        self.trace_path = self.out / f"rank{self.rank}.steps{cfg.start_step}-{last}.trace.json"
        self._left = max(0, first - next_step) + cfg.warmup + cfg.active
        self._prof = profile(
            activities=activities,
            # Counted in trainer steps (step_num below), so ProfilerStep#N in the trace is step N.
            schedule=schedule(skip_first=first, wait=0, warmup=cfg.warmup, active=cfg.active, repeat=1),
            on_trace_ready=self._save,
            record_shapes=cfg.record_shapes,
            with_stack=cfg.with_stack,
            profile_memory=cfg.memory,
        )
        self._prof.step_num = next_step
        self._prof.current_action = self._prof.schedule(next_step)
        if cfg.memory and self.cuda:
            compat.record_cuda_memory_history(True)
        self._prof.start()

    def step(self) -> None:
        """After every training step: advance the schedule; stop once the window is over."""
        if self._next_step:
            self._next_step += 1
            self._capture_if_due()
        if self._prof is None:
            return
        self._prof.step()
        self._left -= 1
        if self._left <= 0:
            self.stop()

    def _save(self, prof: Any) -> None:
        assert self.trace_path is not None
        prof.export_chrome_trace(str(self.trace_path))
        if self.cfg is not None and self.cfg.memory and self.cuda:
            self.dump_memory("memory")

    def dump_memory(self, tag: str) -> Path | None:
        """The recorded CUDA allocator history (after an OOM too), when memory profiling is on."""
        if not (self.cfg is not None and self.cfg.memory and self.cuda and self.enabled):
            return None
        path = self.out / f"rank{self.rank}.{tag}.pickle"
        try:
            compat.dump_cuda_memory_snapshot(str(path))
        except Exception as exc:  # a failed dump must not turn an OOM recovery into a crash
            log.warning("memory snapshot %s not written: %s", path, exc)
            return None
        return path

    def _capture_if_due(self) -> None:
        """nsys/ncu: start the capture before the window's first step, stop it after its last."""
        assert self.cfg is not None
        first, end = self.cfg.start_step, self.cfg.start_step + self.cfg.active
        if self._next_step == first and not self._capturing:
            self._capturing = True
            self._profiler_api(start=True)
        elif self._next_step >= end:
            self._next_step = 0  # the window is over: nothing more to count
            self._end_capture()

    def _end_capture(self) -> None:
        if self._capturing:
            self._capturing = False
            self._profiler_api(start=False)

    def _profiler_api(self, start: bool) -> None:
        """cudaProfilerStart/Stop, after the queued work so the capture starts and ends at a step
        boundary on the device too (one synchronisation at each end of the window)."""
        if not self.cuda:
            return
        import torch.cuda.profiler

        torch.cuda.synchronize()
        if start:
            torch.cuda.profiler.start()
        else:
            torch.cuda.profiler.stop()
        log.info("rank %d: CUDA profiler capture %s", self.rank, "started" if start else "stopped")

    def stop(self) -> None:
        self._end_capture()
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.stop()

    def close(self) -> None:
        self.stop()
        if self.cfg is not None and self.cfg.memory and self.cuda and self.trace_path is not None:
            compat.record_cuda_memory_history(False)
