"""The MLflow sink (``observe.mlflow``): rank 0's metrics to an MLflow run, off the training thread.

``on_row`` only puts numbers on a bounded queue; a daemon thread sends them with ``log_batch``.
While the server is unreachable the thread retries with backoff and the queue fills up to
``queue_size`` values; past that, values are dropped with one warning. At close it waits at most
``close_timeout_s``; whatever did not reach the server is replayed later, from metrics.jsonl, by
``hpcpipe track sync RUN_DIR``. Parameters (the flattened config) and lineage tags go with the
first batch; artifacts and the run's final status at the end (FINISHED, KILLED when preempted or
pruned, else FAILED; `track sync` sets it from events.jsonl when the server missed it).
"""

from __future__ import annotations

import logging
import posixpath
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

from hpcpipe.config.observe import MlflowConfig
from hpcpipe.errors import UserError
from hpcpipe.track.artifacts import log_run_artifacts
from hpcpipe.track.mlflow_client import make_client, open_run, redact, request_limits, resolve_uri, scrub
from hpcpipe.track.params import as_text, flatten, lineage_tags

log = logging.getLogger("hpcpipe.track")

BATCH = 1000  # MLflow's log_batch limit on metrics
BATCH_WINDOW_S = 2.0
PARAM_BATCH = 100  # ... and on params
REQUEST_TIMEOUT_S = 5  # per request, no MLflow retries: the sender retries with backoff


# MLflow's rule for metric names on Linux (mlflow.utils.validation): letters, digits, _ - . / :
# and spaces, at most 250 characters, a normalised relative path. One name it refuses fails the
# whole batch it is in, so every later value of every metric would wait behind it: such a key is
# never sent (``refused_names``).
_MLFLOW_NAME = re.compile(r"^[/\w.\- :]*$")
_MLFLOW_KEY_LENGTH = 250


def mlflow_takes(key: str) -> bool:
    norm = posixpath.normpath(key)
    return (
        bool(_MLFLOW_NAME.match(key))
        and len(key) <= _MLFLOW_KEY_LENGTH
        and norm == key
        and norm != "."
        and not norm.startswith(("..", "/"))
    )


def metric_values(row: dict[str, Any]) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp ms, step) for every number in a metrics row MLflow takes (none for a
    row without a whole-number step)."""
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return []
    stamp = int(float(row.get("time", time.time())) * 1000)
    return [
        (key, float(value), stamp, step)
        for key, value in row.items()
        if key not in ("step", "time")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and mlflow_takes(key)
    ]


def refused_names(row: dict[str, Any]) -> list[str]:
    """The row's numeric keys MLflow refuses as metric names."""
    return [k for k, v in row.items() if isinstance(v, int | float) and not mlflow_takes(k)]


def param_batches(config: dict[str, Any]) -> list[list[tuple[str, str]]]:
    items = [(k[:250], as_text(v)[:6000]) for k, v in flatten(config).items()]
    return [items[i : i + PARAM_BATCH] for i in range(0, len(items), PARAM_BATCH)]


CHANGED_TAG = "hpcpipe.changed."


def log_params(client: Any, run_id: str, config: dict[str, Any], from_step: int) -> tuple[int, list[str]]:
    """The config's params the run lacks; the keys whose value differs from the one logged (a run
    resumed with other settings) go in as tags ``hpcpipe.changed.<key>`` = ``<value> (from step
    N)``, since MLflow never overwrites a param (they kept the old value without a word). Returns
    how many params were new and the keys whose tag was set (said once on stderr)."""
    from mlflow.entities import Param, RunTag

    data = client.get_run(run_id).data
    changed: list[str] = []
    new = 0
    for chunk in param_batches(config):
        fresh = [Param(k, v) for k, v in chunk if k not in data.params]
        moved = [(k, v) for k, v in chunk if _changes_tag(k, v, data.params, data.tags)]
        tags = [RunTag((CHANGED_TAG + k)[:250], f"{v} (from step {from_step})") for k, v in moved]
        if fresh or tags:
            client.log_batch(run_id, params=fresh, tags=tags)
        changed += [k for k, _ in moved]
        new += len(fresh)
    if changed:
        log.warning(
            "MLflow run %s keeps the first value of a param: the changed %s recorded as tags %s<key>",
            run_id, ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else ""), CHANGED_TAG,
        )  # fmt: skip
    return new, changed


def _changes_tag(key: str, value: str, params: dict[str, str], tags: dict[str, str]) -> bool:
    """A logged param whose value is not the one in force now, as the param or the tag says it."""
    if key not in params:
        return False
    said = tags.get((CHANGED_TAG + key)[:250])
    in_force = params[key] if said is None else said.rpartition(" (from step ")[0]
    return in_force != value


class MlflowSink:
    def __init__(
        self, cfg: MlflowConfig, run_dir: Path, run_name: str, config: dict[str, Any], start_step: int = 0
    ) -> None:
        self.cfg, self.start_step = cfg, start_step
        self.uri = resolve_uri(cfg.tracking_uri)
        self.run_dir, self.run_name, self.config = run_dir, run_name, config
        self.client = make_client(self.uri)
        self.run_id: str | None = None
        self.queue: queue.Queue[tuple[str, float, int, int]] = queue.Queue()
        # Values queued or in the batch being sent (retried while the server is down): the bound.
        self._held = 0
        self._held_lock = threading.Lock()
        self.dropped = 0
        self._warned: set[str] = set()
        self._closing = threading.Event()
        self._status = "FINISHED"
        self._stopped = False  # preempted or pruned: ended on purpose, not failed
        self._thread = threading.Thread(target=self._work, name="hpcpipe-mlflow", daemon=True)
        self._thread.start()

    # -- the training thread -------------------------------------------------------------------

    def on_row(self, row: dict[str, Any]) -> None:
        values = metric_values(row)
        refused = refused_names(row)
        if refused:
            self._warn_once(
                "names", f"MLflow refuses the metric names {', '.join(map(repr, refused))}: not sent"
            )
        with self._held_lock:
            room = max(self.cfg.queue_size - self._held, 0)
            kept = values[:room]
            self._held += len(kept)
        for value in kept:
            self.queue.put_nowait(value)
        if len(kept) < len(values):
            self.dropped += len(values) - len(kept)
            self._warn_once("full", f"MLflow queue full ({self.cfg.queue_size} values): dropping values")

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        """Events stay in the run directory's events.jsonl (MLflow gets the metrics alone); a
        stop that is no failure (a preemption, an HPO pruner's) makes the run KILLED at close."""
        if kind in ("preempted", "pruned"):
            self._stopped = True

    def close(self, finished: bool) -> None:
        self._status = "FINISHED" if finished else "KILLED" if self._stopped else "FAILED"
        self._closing.set()
        self._thread.join(self.cfg.close_timeout_s)
        unsent = self._held  # queued, or in the batch being retried
        if self._thread.is_alive() or unsent or self.dropped:
            log.warning(
                "MLflow at %s did not get every value (%d dropped, %d unsent); "
                "replay with: hpcpipe track sync %s",
                redact(self.uri), self.dropped, unsent, self.run_dir,
            )  # fmt: skip

    # -- the sender thread ---------------------------------------------------------------------

    def _work(self) -> None:
        batch: list[tuple[str, float, int, int]] = []
        backoff = 1.0
        while True:
            batch = batch or self._take()
            if not batch:
                if self._closing.is_set():
                    break
                continue
            if self._send(batch):
                batch, backoff = [], 1.0
                continue
            if self._closing.is_set():  # unreachable at the end: leave the rest to `track sync`
                return
            self._closing.wait(backoff)
            backoff = min(backoff * 2, 30.0)
        self._finish()

    def _take(self) -> list[tuple[str, float, int, int]]:
        """The next batch: values arriving within ``BATCH_WINDOW_S`` of the first, up to ``BATCH``.

        One request per window, not per row: a SQLite store spends ~370 us per value in batches
        of 20 and ~100 us in batches of 200, on the training process's CPU.
        """
        try:
            batch = [self.queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + BATCH_WINDOW_S
        while len(batch) < BATCH:
            wait = 0.0 if self._closing.is_set() else deadline - time.monotonic()
            try:
                batch.append(self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _send(self, batch: list[tuple[str, float, int, int]]) -> bool:
        from mlflow.entities import Metric

        try:
            with request_limits(REQUEST_TIMEOUT_S, retries=0):  # its own backoff retries
                if self.run_id is None:
                    self.run_id = self._open()
                self.client.log_batch(self.run_id, metrics=[Metric(*value) for value in batch])
            with self._held_lock:
                self._held -= len(batch)
            return True
        except UserError as exc:  # the run's record: damaged, or its MLflow run deleted; no retry helps
            self._warn_once("record", f"MLflow: nothing sent ({exc})")
            self.dropped += len(batch)
            with self._held_lock:
                self._held -= len(batch)
            return True
        except Exception as exc:
            self._warn_once(
                "send", f"MLflow at {redact(self.uri)} unreachable ({scrub(str(exc))[:200]}); queueing"
            )
            return False

    def _open(self) -> str:
        tags = lineage_tags(self.run_dir) | {"hpcpipe.recipe": str(self.config["run"]["recipe"])}
        run_id = open_run(self.client, self.uri, self.run_dir, self.cfg.experiment, self.run_name, tags)
        log_params(self.client, run_id, self.config, self.start_step)
        return run_id

    def _finish(self) -> None:
        if self.run_id is None:
            return
        try:
            with request_limits(REQUEST_TIMEOUT_S, retries=0):  # its own backoff retries
                log_run_artifacts(self.client, self.run_id, self.run_dir)
                self.client.set_terminated(self.run_id, status=self._status)
        except Exception as exc:
            self._warn_once("finish", f"MLflow artifacts not uploaded ({scrub(str(exc))[:200]})")

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s; `hpcpipe track sync %s` replays the run later", message, self.run_dir)
