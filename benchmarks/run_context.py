"""What every benchmark's JSON line carries, so a ratio is never quoted without its context."""

from __future__ import annotations

import os
import platform

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
