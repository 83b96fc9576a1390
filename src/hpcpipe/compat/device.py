"""Device capabilities and the CUDA allocator's history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcpipe.compat.guard import TorchAPIError, probe, require

_BF16 = "tell whether this CPU multiplies bf16 matrices in hardware (model.base_dtype auto)"


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls on this CPU's own bf16 units (AVX512-BF16 or AMX).

    Without them torch falls back to a reference kernel: 1.2 GFLOP/s against ~100 for fp32 on
    this project's 2-core AVX2 machine. torch has no public query; its CPU autocast tests use
    this one. A torch without it answers False: fp32 is never the slow choice.
    """
    try:
        supported = require(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", _BF16)
    except (TorchAPIError, RuntimeError):  # an op namespace raises RuntimeError, not AttributeError
        return False
    return bool(torch.backends.mkldnn.is_available() and supported())


_MEMORY = "record and dump CUDA allocator history (observe.profile.memory)"


def record_cuda_memory_history(enabled: bool, max_entries: int = 100_000) -> None:
    """Start (or stop) recording every CUDA allocation with its stack, for a snapshot later."""
    record = require("torch.cuda.memory", "_record_memory_history", _MEMORY)
    record("all" if enabled else None, max_entries=max_entries)


def dump_cuda_memory_snapshot(path: str) -> None:
    """Write the recorded history as a pickle that pytorch.org/memory_viz opens (our own output:
    hpcpipe never loads it)."""
    require("torch.cuda.memory", "_dump_snapshot", _MEMORY)(path)


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "cuda.memory._record_memory_history": probe(
        "torch.cuda.memory", "_record_memory_history", purpose=_MEMORY
    ),
    "cuda.memory._dump_snapshot": probe("torch.cuda.memory", "_dump_snapshot", purpose=_MEMORY),
    "ops.mkldnn._is_mkldnn_bf16_supported": probe(
        torch.ops.mkldnn, "_is_mkldnn_bf16_supported", purpose=_BF16
    ),
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
