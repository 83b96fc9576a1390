"""Throughput, MFU and memory figures for metrics rows, measured over logging intervals.

Time is taken between logging points (where the loss is read back anyway), so no extra device
synchronisation is added to each step.
"""

from __future__ import annotations

import resource
import sys
import time

import torch

from hpcpipe.observe.flops import device_peak_flops, mfu, peak_precision


class ThroughputMeter:
    def __init__(
        self,
        items_per_step: int,
        unit: str,
        world_size: int,
        flops_per_item: float | None,
        device: torch.device,
        precision: str,
        peak_tflops_override: float | None,
        convolutions: bool = False,
    ) -> None:
        self.items_per_step = items_per_step  # tokens (or samples) per optimizer step, all ranks
        self.unit = unit
        self.world_size = world_size
        self.flops_per_item = flops_per_item
        self.device = device
        # convolutions: the model has some (under fp32 they run in TF32: cuDNN's default)
        peak_at = peak_precision(precision, convolutions)
        self.peak_flops = device_peak_flops(device, peak_at, peak_tflops_override)
        self._counts: dict[str, torch.Tensor] = {}  # the recipe's counts of the completed steps
        self.start()

    def start(self) -> None:
        """Begin a new interval (after start-up or an evaluation)."""
        self._t0 = time.perf_counter()
        self._steps = 0
        self._data_time = 0.0

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` of the current interval out (a checkpoint save: its cost is in the
        events and goodput, not in the training rate, the step time or the phase shares)."""
        self._t0 += seconds

    def add_step(self, data_time_s: float, counts: dict[str, torch.Tensor] | None = None) -> None:
        """A completed step: its data-loading time and the recipe's counts for it (``counts``:
        those of a step's final attempt only; an attempt an OOM cut short runs again)."""
        self._steps += 1
        self._data_time += data_time_s
        for key, count in (counts or {}).items():
            self._counts[key] = self._counts[key] + count if key in self._counts else count

    def take_counts(self) -> dict[str, torch.Tensor]:
        """The recipe's counts since the last call (on this rank, on the device), reset."""
        counts, self._counts = self._counts, {}
        return counts

    def read(self, counts: dict[str, float] | None = None) -> dict[str, float | None]:
        """Figures for the interval since the last read; starts the next interval.

        ``counts`` are further items counted over all ranks in the interval (supervised tokens):
        each adds ``<key>_per_s_per_device``.
        """
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        steps = max(self._steps, 1)
        rate = self.items_per_step * self._steps / elapsed
        per_device = rate / self.world_size
        flops_mfu = None
        if self.flops_per_item is not None and self.peak_flops is not None:
            flops_mfu = mfu(per_device, self.flops_per_item, self.peak_flops)
        row = {
            f"{self.unit}_per_s": rate,
            f"{self.unit}_per_s_per_device": per_device,
            "mfu": flops_mfu,
            "step_time_s": elapsed / steps,
            "data_time_s": self._data_time / steps,
        }
        for key, count in (counts or {}).items():
            row[f"{key}_per_s_per_device"] = count / elapsed / self.world_size
        self.start()
        return row


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB
