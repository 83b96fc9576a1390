"""NVTX ranges for every step, phase and named region of the training loop, in the ``hpcpipe``
domain, for Nsight Systems and Nsight Compute.

A ``PhaseListener`` (``observe/phases.py``): ``step_begin`` pushes a range named ``step`` whose
payload is the step number, every phase or region pushes a range named exactly as the phase
(``data``, ``forward``, ``comm``, ``backward``, ``optimizer``: the phases ``hpcpipe profile``
reports) or the region (``checkpoint_save``, ``evaluate``, ``all_reduce_eval``,
``all_reduce_metrics``, ``broadcast_buffers``), and the matching end pops it. The step number is
a payload rather than part of the name so that ``nsys stats --report nvtx_sum`` sums all steps
into one ``hpcpipe:step`` row (its mean is the step time), and so that a long run does not
register one string per step with the tool.

Free when no profiler is attached: the ``nvtx`` package then hands out a dummy domain (no tool
loaded through ``NVTX_INJECTION64_PATH``), and ``nvtx_ranges`` returns None, so the loop has no
listener at all. ``NVTX_DISABLE=1`` (the package's own switch, any non-empty value) turns the
ranges off under a profiler too: ``nvtx_ranges`` reads it itself, because the package honours it
in its module-level functions only, not in ``get_domain`` and ``Domain.push_range``. The cost
with a tool attached is measured by ``benchmarks/nvtx_overhead.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from hpcpipe.observe.phases import PhaseListener

log = logging.getLogger("hpcpipe.observe.nvtx")

DOMAIN = "hpcpipe"
STEP_RANGE = "step"
# ARGB, so that a timeline tells the phases apart at a glance (regions stay the tool's default).
COLORS = {
    "data": 0xFFF2C037,  # yellow: waiting for input
    "forward": 0xFF4CAF50,
    "backward": 0xFF2196F3,
    "optimizer": 0xFF9C27B0,
    "comm": 0xFFE53935,  # red: waiting for other ranks
    STEP_RANGE: 0xFF9E9E9E,
}


class NvtxRanges(PhaseListener):
    """Push/pop ranges in one NVTX domain; the attributes of each name are built once."""

    def __init__(self, domain: Any) -> None:
        self._domain = domain
        self._attributes: dict[str, Any] = {}
        self._step = domain.get_event_attributes(message=STEP_RANGE, color=COLORS[STEP_RANGE], payload=0)

    def step_begin(self, step: int) -> None:
        self._step.payload = step
        self._domain.push_range(self._step)

    def step_end(self, step: int) -> None:
        self._domain.pop_range()

    def phase_begin(self, phase: str) -> None:
        attributes = self._attributes.get(phase)
        if attributes is None:
            attributes = self._domain.get_event_attributes(message=phase, color=COLORS.get(phase))
            self._attributes[phase] = attributes
        self._domain.push_range(attributes)

    def phase_end(self, phase: str) -> None:
        self._domain.pop_range()


def nvtx_ranges() -> NvtxRanges | None:
    """The listener when a tool records NVTX in this process; None otherwise (no cost at all)."""
    if os.environ.get("NVTX_DISABLE"):  # as the package reads it: set and non-empty
        log.debug("NVTX ranges off: NVTX_DISABLE is set")
        return None
    try:
        import nvtx
    except ImportError:
        log.debug("NVTX ranges off: the nvtx package is not installed (the `nvtx` extra)")
        return None
    # Creating the domain loads the tool named by NVTX_INJECTION64_PATH (nsys and ncu set it in
    # the processes they start); without one the package returns a dummy domain.
    domain = nvtx.get_domain(DOMAIN)
    if not isinstance(domain, nvtx.Domain):
        log.debug("NVTX ranges off: no profiler records NVTX in this process")
        return None
    return NvtxRanges(domain)
