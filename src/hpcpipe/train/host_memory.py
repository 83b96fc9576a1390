"""Keep freed host memory in the process, so training steps do not page-fault fresh pages.

glibc serves large allocations with ``mmap`` and returns them with ``munmap`` when freed; its
threshold adapts, but a step's big CPU tensors (a GPT's (B, T, V) logits and their gradient,
16 MB each in the quickstart) are freed and allocated again every step, and every new mapping
is zero-filled page by page on first touch. Measured on the quickstart model on 2 cores (torch
2.15): about 2,600 extra page faults per step and 5-10% of the step time, and how much depends
on how long the loop happens to keep the previous step's tensors alive. Fixing the thresholds
(the largest mmap threshold glibc accepts, 32 MiB, and no trimming of the heap top) lets those
blocks be reused from the heap: no page faults in steady state. The process keeps its peak
resident size, which a training process reaches every step anyway.

Nothing happens off glibc (macOS, musl) or when ``parallel.retain_host_memory=false``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # an int: the largest value mallopt takes


def retain_freed_host_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process; True when glibc accepted both."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    accepted = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    accepted = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and accepted
    if not accepted:
        log.debug("mallopt refused the host-memory thresholds; keeping the allocator's defaults")
    return accepted
