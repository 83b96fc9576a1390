"""The Prometheus exporter: one ``/metrics`` endpoint per rank, on ``port + local_rank``.

Each rank serves its own registry from a daemon thread (prometheus-client's HTTP server), so
there is no multiprocess mode and no shared directory; a scrape reads values the training loop
already set and never waits on it. Every series carries ``run``, ``rank``, ``node`` and
``recipe``, never the step (the step is a value: ``hpcpipe_steps_total``). Each node's worker
writes a file-service-discovery target file (``write_sd_targets``) for the endpoints its ranks
bound.

Names follow Prometheus conventions: the ``hpcpipe_`` prefix, base units in the name, ``_total``
on counters. Time fractions come from counters: ``rate(hpcpipe_phase_seconds_total[5m]) /
rate(hpcpipe_step_duration_seconds_sum[5m])`` is each phase's share of step time. Checkpoint
series come from rank 0, which commits; so do OOM recoveries, which every rank goes through. A
port already taken logs one warning and training goes on without this rank's endpoint.
``pushgateway`` sends an end-of-run summary from rank 0.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from hpcpipe.config.observe import PrometheusConfig
from hpcpipe.observe.phases import PhaseListener
from hpcpipe.observe.regions import LONG_PHASES

log = logging.getLogger("hpcpipe.observe.prometheus")

LABELS = ("run", "rank", "node", "recipe")
PHASES = ("data", "forward", "backward", "optimizer", "comm")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SAVE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
EVAL_KEYS = ("val_loss", "val_ppl", "val_acc")


class Exporter(PhaseListener):
    """The metrics of one rank. ``start()`` serves them; the ``on_*`` calls update them; as the
    trainer's phase listener (when it serves) it says when the rank evaluates or saves."""

    def __init__(self, cfg: PrometheusConfig, labels: dict[str, str], unit: str, local_rank: int) -> None:
        self.cfg = cfg
        self.labels = labels
        self.port = None if cfg.port is None else cfg.port + local_rank
        self.registry = CollectorRegistry()
        self._server: Any = None
        self._metrics(unit)

    def _metrics(self, unit: str) -> None:
        reg, names = self.registry, list(LABELS)

        def gauge(name: str, doc: str, *extra: str) -> Gauge:
            return Gauge(name, doc, [*names, *extra], registry=reg)

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*names, *extra], registry=reg)

        self.steps = counter("hpcpipe_steps", "Optimizer steps completed.")
        self.items = counter(f"hpcpipe_{unit}", f"Training {unit} this rank processed (sum over ranks).")
        self.loss = gauge("hpcpipe_loss", "Training loss, mean over ranks, at the last logged step.")
        self.lr = gauge("hpcpipe_learning_rate", "Learning rate at the last logged step.")
        self.grad_norm = gauge("hpcpipe_grad_norm", "Global gradient L2 norm before clipping.")
        self.eval = gauge("hpcpipe_eval_metric", "Last evaluation metric.", "metric")
        self.phase = counter("hpcpipe_phase_seconds", "Seconds spent in each phase of the steps.", "phase")
        self.step_duration = Histogram(
            "hpcpipe_step_duration_seconds", "Wall time of one optimizer step.", names, registry=reg,
            buckets=STEP_BUCKETS,
        )  # fmt: skip
        self.mfu = gauge("hpcpipe_mfu_ratio", "Model FLOPs utilisation over the last logging interval.")
        self.memory = gauge("hpcpipe_memory_peak_bytes", "Peak device memory (CUDA) or resident set (CPU).")
        self.world = gauge("hpcpipe_world_size", "Ranks in the training group.")
        self.last_step = gauge("hpcpipe_last_step_timestamp_seconds", "Unix time the last step finished.")
        self.saves = counter("hpcpipe_checkpoint_saves", "Checkpoints committed (rank 0).")
        self.save_failures = counter("hpcpipe_checkpoint_save_failures", "Checkpoint saves that failed.")
        self.save_seconds = Histogram(
            "hpcpipe_checkpoint_save_duration_seconds", "Time to write and commit a checkpoint.", names,
            registry=reg, buckets=SAVE_BUCKETS,
        )  # fmt: skip
        self.fallbacks = counter("hpcpipe_checkpoint_fallbacks", "Checkpoints that failed verification.")
        self.ooms = counter(
            "hpcpipe_oom_recoveries", "Steps retried with a smaller micro-batch after OOM (rank 0)."
        )
        self.restarts = gauge("hpcpipe_restarts", "Restarts of the worker group so far (elastic agent).")
        self.imbalance = gauge("hpcpipe_imbalance_ratio", "(max - min) / median of the ranks' busy time.")
        self.slowest = gauge("hpcpipe_slowest_rank", "Rank with the most busy time at the last check.")
        self.imbalance_events = counter("hpcpipe_imbalance_events", "Checks above the imbalance threshold.")
        self.long_phase = gauge(
            "hpcpipe_long_phase", "1 while the rank evaluates or saves a checkpoint.", "phase"
        )
        for phase in LONG_PHASES:
            self.long_phase.labels(**self.labels, phase=phase).set(0)
        # Every counter of this rank's labels exported at 0 from the start: a series born at 1 has
        # no rise for increase() to see, and the first failed save (often the run's only one)
        # never fired HpcpipeCheckpointFailing.
        counters = (self.steps, self.items, self.saves, self.save_failures, self.fallbacks, self.ooms)
        for unlabelled in (*counters, self.imbalance_events):
            unlabelled.labels(**self.labels)
        build = Info("hpcpipe_build", "hpcpipe version and git commit.", registry=reg)
        build.info(build_info())
        self.restarts.labels(**self.labels).set(float(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))

    def start(self) -> bool:
        """Serve ``/metrics``; False (after one warning) when there is no port or it is taken."""
        if self.port is None:
            return False
        try:
            self._server, _ = start_http_server(self.port, addr=self.cfg.host, registry=self.registry)
        except OSError as exc:
            log.warning(
                "rank %s: Prometheus exporter off: cannot listen on %s:%d (%s); training continues. "
                "Free the port or set observe.prometheus.port to another base port.",
                self.labels["rank"], self.cfg.host, self.port, exc.strerror or exc,
            )  # fmt: skip
            return False
        return True

    @property
    def serving_port(self) -> int | None:
        """The port this rank's endpoint listens on; None when it serves nothing."""
        return self.port if self._server is not None else None

    def on_step(self, items: float, step_seconds: float) -> None:
        own = self.labels
        self.steps.labels(**own).inc()
        self.items.labels(**own).inc(items)
        self.step_duration.labels(**own).observe(step_seconds)
        self.last_step.labels(**own).set(time.time())

    def on_row(self, row: dict[str, Any], steps: int) -> None:
        """A logged training row (per-step means over ``steps`` steps)."""
        own = self.labels
        gauges = {"loss": self.loss, "lr": self.lr, "grad_norm": self.grad_norm, "mfu": self.mfu,
                  "mem_bytes": self.memory, "world_size": self.world}  # fmt: skip
        for key, gauge in gauges.items():
            if row.get(key) is not None:
                gauge.labels(**own).set(float(row[key]))
        for phase in PHASES:
            value = row.get(f"{phase}_time_s")
            if value is not None:
                self.phase.labels(**own, phase=phase).inc(max(0.0, float(value)) * steps)

    def on_eval(self, metrics: dict[str, float]) -> None:
        for key in EVAL_KEYS:
            if key in metrics:
                self.eval.labels(**self.labels, metric=key).set(float(metrics[key]))

    def on_event(self, kind: str, fields: dict[str, Any]) -> None:
        own = self.labels
        if kind == "checkpoint_committed":
            self.saves.labels(**own).inc()
            self.save_seconds.labels(**own).observe(float(fields.get("write_s", 0.0)))
        elif kind == "checkpoint_save_failed":
            self.save_failures.labels(**own).inc()
        elif kind == "checkpoint_fallback":
            self.fallbacks.labels(**own).inc()
        elif kind == "oom_recovered" and own["rank"] == "0":  # every rank emits it: one recovery, one count
            self.ooms.labels(**own).inc()

    def phase_begin(self, phase: str) -> None:
        if phase in LONG_PHASES:
            self.long_phase.labels(**self.labels, phase=phase).set(1)

    def phase_end(self, phase: str) -> None:
        if phase in LONG_PHASES:
            self.long_phase.labels(**self.labels, phase=phase).set(0)

    def on_imbalance(self, ratio: float, slowest_rank: int, raised: bool) -> None:
        self.imbalance.labels(**self.labels).set(ratio)
        self.slowest.labels(**self.labels).set(slowest_rank)
        if raised:
            self.imbalance_events.labels(**self.labels).inc()

    def close(self, summary: dict[str, float] | None = None) -> None:
        """Stop serving; push ``summary`` to the Pushgateway when one is configured (rank 0)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if summary is not None and self.cfg.pushgateway:
            push_summary(self.cfg.pushgateway, self.labels["run"], summary)


def end_of_run_summary(step: int, steps: int) -> dict[str, float]:
    """The gauges ``push_summary`` sends when a process ends: ``completed`` tells a run that reached
    ``train.steps`` from one preempted, crashed or stopped by divergence (they all end here)."""
    return {
        "steps": float(step),
        "completed": float(step >= steps),
        "finished_timestamp_seconds": time.time(),
    }


def push_summary(url: str, run: str, summary: dict[str, float]) -> bool:
    """``hpcpipe_run_<key>`` gauges for the run, pushed as job ``hpcpipe``, grouped by ``run``."""
    from prometheus_client import push_to_gateway

    registry = CollectorRegistry()
    for key, value in summary.items():
        Gauge(f"hpcpipe_run_{key}", f"End-of-run {key.replace('_', ' ')}.", registry=registry).set(value)
    try:
        push_to_gateway(url, job="hpcpipe", grouping_key={"run": run}, registry=registry, timeout=10)
    except Exception as exc:  # a summary is never worth failing a finished run
        where = urlsplit(url).hostname or "the gateway"  # never the URL: it may carry credentials
        log.warning("Pushgateway at %s refused the run summary: %s", where, type(exc).__name__)
        return False
    return True


def build_info() -> dict[str, str]:
    """``version`` and ``git_sha`` (``unknown`` outside a git checkout) of the running hpcpipe."""
    from hpcpipe import __version__

    package = Path(__file__).resolve().parents[1]
    sha = "unknown"
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--short=12", "HEAD"],
            cwd=package, capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
        lines = out.stdout.split()
        # Only hpcpipe's own checkout: an installed copy inside another repository is not it.
        if out.returncode == 0 and len(lines) == 2 and Path(lines[0]) / "src" / "hpcpipe" == package:
            sha = lines[1]
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": __version__, "git_sha": sha}


def scrape_host(cfg: PrometheusConfig, node: str) -> str:
    """The address Prometheus reaches this node's endpoints at."""
    if cfg.host in ("0.0.0.0", "::", ""):
        return socket.getfqdn(node)
    return cfg.host


def sd_targets_path(out_dir: Path, cfg: PrometheusConfig, run: str, node: str) -> Path:
    """``<targets_dir>/<run>@<node>.json`` (``targets_dir`` default: ``<out_dir>/prometheus-targets``)."""
    root = Path(cfg.targets_dir) if cfg.targets_dir else out_dir / "prometheus-targets"
    return root / f"{run}@{node}.json"


def write_sd_targets(
    out_dir: Path, cfg: PrometheusConfig, node: str, ports: list[int], run: str
) -> Path | None:
    """A file-service-discovery target group for the ``ports`` this node's exporters listen on;
    None without an exporter. No port bound removes the file: a port another process held
    (a second run on the same base port) would have Prometheus scrape that process as this run.

    Point ``file_sd_configs`` at ``<targets_dir>/*.json``. The worker removes the file when its
    exporters stop at the end of a run that finished, was preempted or pruned, so Prometheus
    stops scraping it; a crashed run's file stays (its targets then read ``up == 0``: the
    HpcpipeRankDown alert) until the next start rewrites it.
    """
    if cfg.port is None:
        return None
    out = sd_targets_path(out_dir, cfg, run, node)
    if not ports:
        out.unlink(missing_ok=True)
        return None
    host = scrape_host(cfg, node)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    group = {
        "targets": [f"{host}:{port}" for port in sorted(ports)],
        "labels": {"hpcpipe_run": run, "hpcpipe_node": node},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps([group], indent=2) + "\n")
    tmp.replace(out)  # Prometheus re-reads the file on change: never let it see half of one
    return out


def node_ports(served: list[tuple[str, int | None]], node: str) -> list[int]:
    """The ports ``node``'s ranks serve, from every rank's (node, serving port or None)."""
    return sorted(port for where, port in served if where == node and port is not None)


def remove_sd_targets(out_dir: Path, cfg: PrometheusConfig, *, run: str, node: str) -> None:
    # Keyword-only: called (cfg, node, run) it unlinked a file that never existed (missing_ok),
    # and every finished run stayed a target (HpcpipeRankDown for ever; rates counted twice).
    if cfg.port is not None:
        sd_targets_path(out_dir, cfg, run, node).unlink(missing_ok=True)
