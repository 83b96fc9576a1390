"""OpenTelemetry traces of training: the one entry point the trainer's telemetry calls.

**Off costs nothing.** With ``observe.otel.endpoint`` null, ``step_tracer`` returns None and
nothing of OpenTelemetry is imported: this module imports only ``otel_ids.py`` (standard library).
On, ``otel_steps.py`` (the spans) and ``otel_export.py`` (provider, batching, OTLP) are loaded.

**One trace per training step, without communication.** Every rank derives the same trace id
from the run id and the step (``otel_ids.py``). Rank 0's step span is the root; rank r's step
span names rank 0's as its parent, so a trace reads rank 0 → every other rank → each rank's
phases (data, forward, comm, backward, optimizer) and the regions after the step
(all_reduce_metrics, checkpoint_save, evaluate); checkpoint save/verify/restore spans come from
the store's events (``otel_steps.py``).

**The W3C environment carrier.** ``hpcpipe run`` puts its train step's context in
``TRACEPARENT``; rank 0's step spans link to it, so a pipeline trace and its training traces point
at each other.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from hpcpipe.observe.otel_ids import TRACEPARENT_VAR, Who, launch_attempt, parse_traceparent

if TYPE_CHECKING:
    from hpcpipe.config.observe import OtelConfig
    from hpcpipe.observe.metrics import EventLog
    from hpcpipe.observe.otel_steps import StepTracer


def require_otel(cfg: OtelConfig) -> None:
    """Tracing is on: the ``otel`` extra must be installed (a ConfigError, exit 2, otherwise)."""
    from hpcpipe.errors import ConfigError

    needed = ["opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"]
    if cfg.protocol == "grpc":
        needed[1] = "opentelemetry.exporter.otlp.proto.grpc"
    try:
        missing = [name for name in needed if importlib.util.find_spec(name) is None]
    except ModuleNotFoundError:  # a parent package is missing altogether
        missing = needed
    if missing:
        raise ConfigError(
            f"observe.otel.endpoint is set but {missing[0]} is not installed: pip install 'hpcpipe[otel]'"
        )


def step_tracer(
    cfg: OtelConfig, run: str, rank: int, world_size: int, host: str, events: EventLog
) -> StepTracer | None:
    """The trainer's span maker (a phase listener), or None when tracing is off (no import)."""
    if cfg.endpoint is None:
        return None
    require_otel(cfg)
    from hpcpipe.observe.otel_steps import StepTracer

    who = Who(run, launch_attempt(os.environ, world_size), rank, host)
    return StepTracer(cfg, who, events, parse_traceparent(os.environ.get(TRACEPARENT_VAR)))
