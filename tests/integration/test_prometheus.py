"""A real Prometheus (Debian's 2.42) on loopback scrapes a real 2-rank training run found through
the file-service-discovery target file the workers write; every dashboard panel's PromQL runs
against it; the exporters listen on loopback only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import tiny_job_sets
from tests.unit.project.test_deploy import _dashboard_module, concrete

from hpcpipe.netutil import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus absent (make system-deps)"),
]


class Prometheus:
    """A throwaway server: temporary config and storage, loopback only, always stopped."""

    def __init__(self, root: Path, targets_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "hpcpipe",
                "file_sd_configs": [{"files": [str(targets_dir / "*.json")], "refresh_interval": "1s"}],
            }],
        }  # fmt: skip
        (root / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = (root / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self.proc.poll() is None, (root / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:  # a bad query: 400 with the error in the body
            return json.loads(exc.read())  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path, tmp_path / "prometheus-targets")  # run.out_dir is tmp_path
    try:
        yield server
    finally:
        server.stop()


def _listening(ports: set[int]) -> dict[int, str]:
    """Local address of each listening TCP socket on ``ports`` (from /proc/net/tcp and tcp6)."""
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.rsplit(":", 1)
            if state == "0A" and int(port, 16) in ports:  # 0A: LISTEN
                found[int(port, 16)] = address
    return found


def _two_free_ports() -> int:
    """A port P with P + 1 free as well (the exporters of local ranks 0 and 1)."""
    while True:
        base = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base


def test_prometheus_scrapes_both_ranks_and_runs_every_panel(tmp_path: Path, prometheus: Prometheus) -> None:
    base = _two_free_ports()
    sets = tiny_job_sets(
        tmp_path, "scraped", "parallel.strategy=ddp", "train.steps=5000", "observe.log_every=5",
        f"observe.prometheus.port={base}", "observe.imbalance.every_steps=10", "checkpoint.every_steps=100",
    )  # fmt: skip
    # Slow enough (~20 ms a step) that Prometheus scrapes the run for several seconds.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCPIPE_CHAOS_SLOW": "where=data,seconds=0.02"}
    log = tmp_path / "train.log"
    with log.open("w") as out:
        train = subprocess.Popen(
            [sys.executable, "-m", "hpcpipe", "train", "tiny", "--nproc", "2", *sets],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        wanted = ('hpcpipe_steps_total{run="scraped"} > 0', 'hpcpipe_loss{run="scraped"}')
        found: dict[str, list[dict[str, Any]]] = {}
        # Both ranks' step counters and losses (the loss comes with the first logged step).
        while any({r["metric"]["rank"] for r in found.get(q, [])} != {"0", "1"} for q in wanted):
            assert train.poll() is None, f"training ended before both ranks were scraped: {log.read_text()}"
            assert time.monotonic() < deadline, f"Prometheus never saw both ranks: {found}"
            time.sleep(0.5)
            found = {q: prometheus.query(q)["data"]["result"] for q in wanted}
        assert _listening({base, base + 1}) == {base: "0100007F", base + 1: "0100007F"}  # 127.0.0.1 only
        assert all(0 < float(r["value"][1]) < 20 for r in found[wanted[1]])
        time.sleep(3)  # a few more scrapes, so rate() over the panels' windows has two points
        for expr in _dashboard_module().all_exprs():
            answer = prometheus.query(concrete(expr))
            assert answer["status"] == "success", (expr, answer)
        for expr in ('sum by (run) (rate(hpcpipe_tokens_total{run=~".*"}[1m]))', "hpcpipe_build_info"):
            assert prometheus.query(expr)["data"]["result"], expr
        targets = tmp_path / "prometheus-targets"
        assert [p.name for p in targets.iterdir()] == [f"scraped@{socket.gethostname()}.json"]
    finally:
        if train.poll() is None:
            os.kill(train.pid, signal.SIGUSR1)  # preemption: the workers checkpoint, then exit 75
        train.wait(timeout=120)
    assert train.returncode == 75, log.read_text()[-3000:]
    assert list((tmp_path / "prometheus-targets").iterdir()) == []  # preempted: no longer a target
