"""The tracking sinks of one run, behind the three calls the trainer makes (rank 0 only).

A sink that fails is logged once and dropped: tracking never ends a training run. Events come
from the training thread and from the checkpoint store's background threads (a verification, a
durable copy), so the calls are serialised: TensorBoard's and MLflow's clients are not made to be
called from two threads at once, and a call after ``close`` reaches no sink.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from hpcpipe.config.observe import ObserveConfig
from hpcpipe.track.mlflow_client import scrub

log = logging.getLogger("hpcpipe.track")


class Sink(Protocol):
    def on_row(self, row: dict[str, Any]) -> None: ...
    def on_event(self, kind: str, fields: dict[str, Any]) -> None: ...
    def close(self, finished: bool) -> None: ...


class Trackers:
    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self._lock = threading.RLock()  # re-entered, not deadlocked, should a sink ever emit an event

    @classmethod
    def open(
        cls, cfg: ObserveConfig, run_dir: Path, run_name: str, config: dict[str, Any], start_step: int
    ) -> Trackers:
        """The sinks ``cfg`` turns on. Missing extras and URIs are configuration errors (exit 2)."""
        sinks: list[Sink] = []
        if cfg.tensorboard:
            from hpcpipe.track.tensorboard import TensorBoardSink

            sinks.append(TensorBoardSink(run_dir, config, start_step))
        if cfg.mlflow is not None:
            from hpcpipe.track.mlflow_run import MlflowSink

            sinks.append(MlflowSink(cfg.mlflow, run_dir, run_name, config, start_step))
        return cls(sinks)

    def on_row(self, row: dict[str, Any]) -> None:
        self._each("on_row", row)

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        self._each("on_event", kind, fields)

    def close(self, finished: bool) -> None:
        with self._lock:
            self._each_held("close", finished)
            self.sinks = []

    def _each(self, method: str, *args: Any) -> None:
        with self._lock:
            self._each_held(method, *args)

    def _each_held(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:
                log.warning("%s stopped: %s", type(sink).__name__, scrub(str(exc))[:300])
                self.sinks.remove(sink)
