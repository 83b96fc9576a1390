"""``hpcpipe track sync RUN_DIR``: replay a run directory into MLflow, filling whatever is missing.

The run directory is the source of truth. Sync opens the run's recorded MLflow run (or creates
one), sets its lineage tags, logs the parameters it lacks, every metrics.jsonl value the server
does not have as the newest at its key and step, and the artifacts; the run's status is the one
its events end with (``final_status``: FINISHED, KILLED for a preemption, FAILED for a hang).
Running it twice sends nothing new the second time.
"""

from __future__ import annotations

import bisect
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_events, read_metrics, trained_to_the_end
from hpcpipe.track.artifacts import log_run_artifacts
from hpcpipe.track.mlflow_client import make_client, open_run, resolve_uri
from hpcpipe.track.mlflow_run import BATCH, log_params, metric_values, refused_names
from hpcpipe.track.params import lineage_tags
from hpcpipe.yamlfile import read_yaml_file


@dataclass(frozen=True)
class SyncResult:
    run_id: str
    params: int
    metrics: int
    artifacts: int
    finished: bool
    refused: list[str]  # metric names MLflow does not take (never sent)
    changed: list[str]  # params logged with another value: now tags hpcpipe.changed.<key>
    status: str | None = None  # the status set (None: left as it was)


def sync_run(run_dir: Path, tracking_uri: str | None = None, experiment: str | None = None) -> SyncResult:
    """Replay ``run_dir``; the URI and experiment default to its config's ``observe.mlflow``."""
    from mlflow.entities import Metric

    config = _run_config(run_dir)
    mlflow_cfg = config["observe"]["mlflow"]
    uri = resolve_uri(tracking_uri or mlflow_cfg.get("tracking_uri"))
    client = make_client(uri)
    tags = lineage_tags(run_dir) | {"hpcpipe.recipe": str(config["run"]["recipe"])}
    name = experiment or mlflow_cfg.get("experiment") or "hpcpipe"
    run_id = open_run(client, uri, run_dir, name, str(config["run"]["name"]), tags, resume=False)
    params, changed = log_params(client, run_id, config, _resumed_at(run_dir))
    rows = _with_times(read_metrics(run_dir))
    refused = sorted({key for row in rows for key in refused_names(row)})
    missing = _missing_values(client, run_id, rows)
    for start in range(0, len(missing), BATCH):
        client.log_batch(run_id, metrics=[Metric(*v) for v in missing[start : start + BATCH]])
    artifacts = log_run_artifacts(client, run_id, run_dir)
    section = config.get("train")
    train: dict[str, Any] = section if isinstance(section, dict) else {}
    steps, epochs = train.get("steps"), train.get("epochs")
    epochs = epochs if isinstance(epochs, int | float) and not isinstance(epochs, bool) else None
    finished = isinstance(steps, int) and trained_to_the_end(run_dir, steps, epochs)
    status, ended_at = final_status(read_events(run_dir), finished)
    if status is not None:  # otherwise the run may still be training: its status stays as it is
        client.set_terminated(run_id, status=status, end_time=ended_at)
    done = status == "FINISHED"
    return SyncResult(run_id, params, len(missing), artifacts, done, refused, changed, status)


# How a start of the run ended, by the event it wrote last (a crash writes none); a start's
# events begin with group_start (restart, resumed after it).
ENDINGS = {"run_finished": "FINISHED", "preempted": "KILLED", "pruned": "KILLED", "hang": "FAILED"}
STARTS = frozenset({"group_start", "restart", "resumed"})


def final_status(events: list[dict[str, Any]], finished: bool) -> tuple[str | None, int | None]:
    """The MLflow status of a run whose last start wrote ``events`` last, and when it ended (ms):
    FINISHED when it trained to the end (``finished``), KILLED when a preemption or an HPO pruner
    stopped it, FAILED when a hang did; (None, None) when its last start wrote no ending (still
    training, or crashed: the status is left as it is), or when that ending is the finish of an
    earlier, shorter run. The sink's own status at close is lost when the server is unreachable
    then: a preempted run stayed FAILED or RUNNING."""
    status, ended_at = None, None
    for event in events:
        kind = event.get("event")
        if kind in STARTS:
            status, ended_at = None, None
        elif kind in ENDINGS:
            status, ended_at = ENDINGS[kind], event.get("time")
    if (status == "FINISHED") != finished:
        return None, None
    when = int(float(ended_at) * 1000) if isinstance(ended_at, int | float) else None
    return status, when


def _resumed_at(run_dir: Path) -> int:
    """The step config.yaml's values are in force from: the last resume's (0: never resumed)."""
    steps = [e.get("step") for e in read_events(run_dir) if e.get("event") == "resumed"]
    return next((s for s in reversed(steps) if isinstance(s, int)), 0)


def _with_times(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without a ``time`` (evaluations written before they recorded theirs) take the one of
    the nearest timed row at or before their step, else the first after it: MLflow stamped every
    such value with the moment of the sync."""
    timed = sorted(
        (row["step"], float(row["time"]))
        for row in rows
        if _whole(row.get("step")) and isinstance(row.get("time"), int | float)
    )
    if not timed:
        return rows
    steps = [step for step, _ in timed]
    out = []
    for row in rows:
        if "time" in row or not _whole(row.get("step")):
            out.append(row)
            continue
        at = bisect.bisect_right(steps, row["step"])
        out.append({**row, "time": timed[at - 1][1] if at else timed[0][1]})
    return out


def _whole(step: Any) -> bool:
    return isinstance(step, int) and not isinstance(step, bool)


def _missing_values(
    client: Any, run_id: str, rows: list[dict[str, Any]]
) -> list[tuple[str, float, int, int]]:
    """The rows' values the server lacks (one history request per key): at a (key, step) it has
    no value for, or whose newest value there is another one. A rollback resumed from an earlier
    checkpoint: metrics.jsonl kept the resumed run's values, while the server may hold only the
    discarded attempt's (the sink could not send). MLflow cannot delete a value, so the run
    directory's is logged after the server's newest at that step, and is the newest there."""
    values = {(v[0], v[3]): v for row in rows for v in metric_values(row)}  # a later row wins
    newest: dict[tuple[str, int], Any] = {}
    for key in sorted({key for key, _ in values}):
        for metric in client.get_metric_history(run_id, key):
            at = (key, int(metric.step))
            if at not in newest or metric.timestamp >= newest[at].timestamp:
                newest[at] = metric
    missing = []
    for at, (key, value, stamp, step) in values.items():
        have = newest.get(at)
        if have is None:
            missing.append((key, value, stamp, step))
        elif not _same(float(have.value), value):
            missing.append((key, value, max(stamp, int(have.timestamp) + 1), step))
    return missing


def _same(server: float, local: float) -> bool:
    """The server holds ``local`` already: a NaN never equals itself, and MLflow's SQL store
    keeps +-inf as +-float max; either was sent again on every sync otherwise."""
    if math.isinf(local) and abs(server) == sys.float_info.max:
        server = math.copysign(math.inf, server)
    return server == local or (math.isnan(server) and math.isnan(local))


def _run_config(run_dir: Path) -> dict[str, Any]:
    path = RunLayout(run_dir).config
    if not path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no config.yaml)")
    config = read_yaml_file(path, "run's config")
    run = config.get("run") if isinstance(config, dict) else None
    if not isinstance(run, dict) or not {"recipe", "name"} <= run.keys():
        raise UserError(f"{path}: not an hpcpipe job config (no run.recipe and run.name)")
    observe = config.get("observe") or {}
    mlflow = observe.get("mlflow") if isinstance(observe, dict) else None
    if not isinstance(observe, dict) or not isinstance(mlflow or {}, dict):
        raise UserError(f"{path}: observe.mlflow is not a section")
    return {**config, "observe": {**observe, "mlflow": mlflow or {}}}
