"""What every benchmark's JSON line carries, so a ratio is never quoted without its context."""

from __future__ import annotations

import os
import platform
import statistics

import torch

import hpcpipe


def run_context() -> dict[str, object]:
    """torch and hpcpipe versions, cores, torch threads, Python, and the device type."""
    return {
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "hpcpipe": hpcpipe.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def print_rates(label: str, unit: str, runs: dict[str, list[float]], decimals: int = 1) -> None:
    """The side-by-side table every overhead benchmark prints: median, min and max per loop."""
    print(f"{label:<10}{'median ' + unit:>14}{'min':>10}{'max':>10}")
    for name, xs in runs.items():
        med = statistics.median(xs)
        print(f"{name:<10}{med:>14,.{decimals}f}{min(xs):>10,.{decimals}f}{max(xs):>10,.{decimals}f}")
