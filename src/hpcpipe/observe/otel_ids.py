"""The ids of hpcpipe's spans, derived alike on every rank, and the W3C ``traceparent`` carrier.

Standard library only: ``otel.py`` (the entry point), ``otel_steps.py`` (the trainer's spans) and
``pipeline/tracing.py`` use it without importing OpenTelemetry.

- ``trace_id = H(run, attempt, step)``: every rank's spans of training step N share one trace;
- ``span_id = H(run, attempt, step, rank)``: each rank's step span; rank r's names rank 0's as
  its parent without any communication;
- ``derived_span_id(parent, name)``: a span id fixed before the span starts (``hpcpipe run``
  announces its train step's in ``TRACEPARENT``).

The run id is ``run.name``: the run directory's name, the Prometheus ``run`` label and the sweep
rows' ``run_id``. ``attempt`` names one start of the worker group (``launch_attempt``): after a
restart the same step runs again, and its spans must not reuse the ids of the first try.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass

TRACEPARENT_VAR = "TRACEPARENT"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# Set identically for every rank of one worker group by the launcher that started it: torch's
# elastic agent (its rendezvous id, which hpcpipe makes unique per launch, and restart count)
# and Slurm (job, step, and requeue count).
_ATTEMPT_VARS = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
)


@dataclass(frozen=True)
class Who:
    """The identity every span carries: run id, launch attempt, rank, host."""

    run: str
    attempt: str
    rank: int
    host: str


def launch_attempt(environ: dict[str, str] | os._Environ[str], world_size: int) -> str:
    """What tells this start of the worker group from an earlier one, the same on every rank.

    A single process has no one to agree with: it takes a random id. Ranks started by hand
    (``mp.spawn``) without a launcher's variables share ``""``, and a rerun of such a group under
    the same run name reuses its ids.
    """
    parts = [f"{name}={environ[name]}" for name in _ATTEMPT_VARS if environ.get(name)]
    if world_size == 1:
        parts.append(uuid.uuid4().hex)
    return ",".join(parts)


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()


def step_trace_id(run: str, attempt: str, step: int) -> int:
    """The 128-bit trace id of training step ``step`` (never 0: 0 is W3C's invalid id)."""
    return int.from_bytes(_digest("hpcpipe-trace", run, attempt, step)[:16], "big") or 1


def step_span_id(run: str, attempt: str, step: int, rank: int) -> int:
    """The 64-bit span id of ``rank``'s span of step ``step`` (never 0)."""
    return int.from_bytes(_digest("hpcpipe-step", run, attempt, step, rank)[:8], "big") or 1


def derived_span_id(parent_span_id: int, name: str) -> int:
    """A child's span id fixed by its parent and name (the pipeline announces its train step's
    id in ``TRACEPARENT`` before the step's span exists)."""
    return int.from_bytes(_digest("hpcpipe-child", parent_span_id, name)[:8], "big") or 1


@dataclass(frozen=True)
class TraceParent:
    trace_id: int
    span_id: int
    sampled: bool


def parse_traceparent(value: str | None) -> TraceParent | None:
    """A W3C ``traceparent`` (version 00); None when absent or malformed (ignored, not an error)."""
    match = _TRACEPARENT.match((value or "").strip().lower())
    if match is None:
        return None
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, sampled=bool(int(match.group(3), 16) & 1))


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"
