"""The Prometheus exporter: names, types and labels; promtool's lint; ports; loopback; pushes."""

from __future__ import annotations

import http.server
import json
import logging
import shutil
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpcpipe.config.observe import PrometheusConfig
from hpcpipe.netutil import free_port
from hpcpipe.observe.prometheus import (
    Exporter,
    end_of_run_summary,
    node_ports,
    push_summary,
    remove_sd_targets,
    write_sd_targets,
)

LABELS = {"run": "r1", "rank": "1", "node": "n1", "recipe": "gpt"}


def _fed_exporter(port: int | None = None) -> Exporter:
    exporter = Exporter(PrometheusConfig(port=port), LABELS, "tokens", local_rank=0)
    exporter.on_step(items=512, step_seconds=0.2)
    exporter.on_step(items=512, step_seconds=0.3)
    row = {"step": 2, "loss": 3.5, "lr": 1e-3, "grad_norm": 0.7, "mfu": 0.31, "mem_bytes": 2**30,
           "world_size": 2, "data_time_s": 0.01, "forward_time_s": 0.05, "backward_time_s": 0.1,
           "optimizer_time_s": 0.02, "comm_time_s": 0.03}  # fmt: skip
    exporter.on_row(row, steps=2)
    exporter.on_eval({"val_loss": 3.7, "val_ppl": 40.4})
    exporter.on_event("checkpoint_committed", {"step": 2, "write_s": 1.5})
    exporter.on_event("checkpoint_fallback", {"step": 1})
    exporter.on_event("oom_recovered", {"step": 2})
    exporter.on_imbalance(0.5, slowest_rank=1, raised=True)
    return exporter


def _families(exporter: Exporter) -> dict[str, Any]:
    text = generate_latest(exporter.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_names_types_and_labels_follow_prometheus_conventions() -> None:
    families = _families(_fed_exporter())
    expected = {
        "hpcpipe_steps": "counter",
        "hpcpipe_tokens": "counter",
        "hpcpipe_loss": "gauge",
        "hpcpipe_learning_rate": "gauge",
        "hpcpipe_grad_norm": "gauge",
        "hpcpipe_eval_metric": "gauge",
        "hpcpipe_phase_seconds": "counter",
        "hpcpipe_step_duration_seconds": "histogram",
        "hpcpipe_mfu_ratio": "gauge",
        "hpcpipe_memory_peak_bytes": "gauge",
        "hpcpipe_last_step_timestamp_seconds": "gauge",
        "hpcpipe_checkpoint_saves": "counter",
        "hpcpipe_checkpoint_save_duration_seconds": "histogram",
        "hpcpipe_checkpoint_fallbacks": "counter",
        "hpcpipe_oom_recoveries": "counter",
        "hpcpipe_restarts": "gauge",
        "hpcpipe_imbalance_ratio": "gauge",
        "hpcpipe_slowest_rank": "gauge",
        "hpcpipe_long_phase": "gauge",
        "hpcpipe_build_info": "gauge",  # an Info metric: a gauge of 1 with the labels
    }
    for name, kind in expected.items():
        assert name in families, name
        assert families[name].type == kind, name
    samples = {s.name: s for f in families.values() for s in f.samples}
    assert samples["hpcpipe_steps_total"].value == 2
    assert samples["hpcpipe_tokens_total"].value == 1024
    assert samples["hpcpipe_loss"].value == 3.5
    assert samples["hpcpipe_step_duration_seconds_count"].value == 2
    assert samples["hpcpipe_checkpoint_saves_total"].value == 1
    assert samples["hpcpipe_build_info"].labels.keys() == {"version", "git_sha"}
    for family in families.values():
        for sample in family.samples:
            assert "step" not in sample.labels  # the step is a value, never a label
            if family.name != "hpcpipe_build_info":
                assert {k: sample.labels[k] for k in LABELS} == LABELS
    phases = {s.labels["phase"]: s.value for s in families["hpcpipe_phase_seconds"].samples
              if s.name.endswith("_total")}  # fmt: skip
    expected_phases = {"data": 0.02, "forward": 0.1, "backward": 0.2, "optimizer": 0.04, "comm": 0.06}
    assert phases == pytest.approx(expected_phases)


def test_counters_start_at_zero_and_an_oom_counts_once_over_the_ranks() -> None:
    """A counter exported first at 1 has no rise for increase(): the first failed save never
    fired HpcpipeCheckpointFailing. Every rank goes through an OOM recovery: one count, rank 0's."""
    fresh = Exporter(PrometheusConfig(), LABELS, "tokens", local_rank=0)
    samples = {s.name: s.value for f in _families(fresh).values() for s in f.samples}
    for name in ("steps", "tokens", "checkpoint_saves", "checkpoint_save_failures", "oom_recoveries"):
        assert samples[f"hpcpipe_{name}_total"] == 0, name
    assert samples["hpcpipe_imbalance_events_total"] == 0
    counts = []
    for rank in ("0", "1"):
        exporter = Exporter(PrometheusConfig(), LABELS | {"rank": rank}, "tokens", local_rank=int(rank))
        exporter.on_event("oom_recovered", {"step": 2})
        counts.append(exporter.ooms.labels(**exporter.labels)._value.get())
    assert counts == [1, 0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool absent (apt-get install prometheus)")
def test_promtool_accepts_the_exposition() -> None:
    text = generate_latest(_fed_exporter().registry)
    command = ["promtool", "check", "metrics"]
    proc = subprocess.run(command, input=text, capture_output=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_serves_on_loopback_by_default_and_stops() -> None:
    port = free_port()
    exporter = _fed_exporter(port)
    assert exporter.start()
    try:
        assert exporter._server.server_address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'hpcpipe_steps_total{node="n1",rank="1",recipe="gpt",run="r1"} 2.0' in body
    finally:
        exporter.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_taken_port_warns_once_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        exporter = Exporter(PrometheusConfig(port=port), LABELS, "tokens", local_rank=0)
        with caplog.at_level(logging.WARNING, logger="hpcpipe.observe.prometheus"):
            assert not exporter.start()
        exporter.on_step(items=1, step_seconds=0.1)  # updates still work: nothing serves them
        exporter.close()
    (record,) = caplog.records
    assert f"127.0.0.1:{port}" in record.getMessage()
    assert "training continues" in record.getMessage()
    assert "observe.prometheus.port" in record.getMessage()


def test_local_rank_offsets_the_port() -> None:
    exporter = Exporter(PrometheusConfig(port=9400), LABELS, "samples", local_rank=3)
    assert exporter.port == 9403
    assert "hpcpipe_samples" in _families(exporter)


def test_file_sd_targets_list_the_bound_ports_and_go_away(tmp_path: Path) -> None:
    cfg = PrometheusConfig(port=9400)
    path = write_sd_targets(tmp_path, cfg, "node7", [9403, 9400, 9401, 9402], "run-a")
    assert path == tmp_path / "prometheus-targets" / "run-a@node7.json"
    (group,) = json.loads(path.read_text())
    assert group["targets"] == [f"127.0.0.1:{9400 + i}" for i in range(4)]
    assert group["labels"] == {"hpcpipe_run": "run-a", "hpcpipe_node": "node7"}
    wide = write_sd_targets(tmp_path, PrometheusConfig(port=9400, host="0.0.0.0"), "node7", [9400], "run-b")
    assert wide is not None
    assert json.loads(wide.read_text())[0]["targets"] == [f"{socket.getfqdn('node7')}:9400"]
    remove_sd_targets(tmp_path, cfg, run="run-a", node="node7")
    assert not path.exists()
    assert write_sd_targets(tmp_path, PrometheusConfig(), "node7", [9400], "run-c") is None


def test_a_port_another_process_holds_is_not_advertised(tmp_path: Path) -> None:
    """A second run on the same base port: its target file listed the first run's endpoint,
    and Prometheus counted that run twice."""
    base = free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base))
        squatter.listen()
        cfg = PrometheusConfig(port=base)
        exporters = [Exporter(cfg, LABELS, "tokens", local_rank=i) for i in range(2)]
        started = [exporter.start() for exporter in exporters]
        try:
            served = [("node7", e.serving_port) for e in exporters] + [("node8", base + 5)]
            assert node_ports(served, "node7") == ([base + 1] if started[1] else [])
            path = tmp_path / "prometheus-targets" / "run-a@node7.json"
            path.parent.mkdir()
            path.write_text("[]")  # an earlier crashed start's file
            assert write_sd_targets(tmp_path, cfg, "node7", node_ports(served[:1], "node7"), "run-a") is None
            assert not path.exists()  # nothing bound: nothing advertised, the stale file gone
        finally:
            for exporter in exporters:
                exporter.close()
    assert started[0] is False


class _Gateway(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Gateway.received.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_end_of_run_summary_reaches_a_pushgateway(caplog: pytest.LogCaptureFixture) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert push_summary(url, "run-a", {"steps": 40.0, "final_loss": 2.5})
    finally:
        server.shutdown()
        server.server_close()
    method, path, body = _Gateway.received[-1]
    assert (method, path) == ("PUT", "/metrics/job/hpcpipe/run/run-a")
    assert b"hpcpipe_run_steps 40.0" in body
    # An unreachable gateway: a warning that names the host but never the URL's credentials.
    with caplog.at_level(logging.WARNING):
        assert not push_summary(f"http://user:s3cret@127.0.0.1:{free_port()}", "run-a", {"steps": 1.0})
    assert "s3cret" not in caplog.text
    assert "127.0.0.1" in caplog.text


def test_build_info_names_this_checkout() -> None:
    from hpcpipe import __version__
    from hpcpipe.observe.prometheus import build_info

    root = Path(__file__).resolve().parents[3]
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=False
    )
    expected = head.stdout.strip() if head.returncode == 0 else "unknown"
    assert build_info() == {"version": __version__, "git_sha": expected}


def test_the_end_of_run_summary_tells_a_completed_run_from_a_stopped_one() -> None:
    """Every process ends through Trainer.close: a preempted run pushed what a finished one did."""
    assert end_of_run_summary(1411, 4000)["completed"] == 0.0
    assert end_of_run_summary(4000, 4000)["completed"] == 1.0
    assert end_of_run_summary(4000, 4000)["steps"] == 4000.0


def test_a_long_phase_is_exported_while_it_runs() -> None:
    """HpcpipeRunStalled fired during long evaluations and checkpoint saves: no step finishes then."""
    import torch

    from hpcpipe.observe.phases import PhaseTimer

    exporter = Exporter(PrometheusConfig(port=9400), LABELS, "tokens", local_rank=0)
    timer = PhaseTimer(torch.device("cpu"))
    timer.listeners.append(exporter)

    def saving() -> float:
        return exporter.long_phase.labels(**LABELS, phase="checkpoint_save")._value.get()

    with timer.region("checkpoint_save"):
        assert saving() == 1
        timer.begin("forward")  # a step's phases leave it alone
        assert saving() == 1
    assert saving() == 0
