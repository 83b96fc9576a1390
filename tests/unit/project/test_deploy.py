"""deploy/: the Grafana dashboard is what the generator makes and its PromQL parses; the
Prometheus config is valid; the alert rules fire (and stay quiet) as their unit tests say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool absent (apt-get install prometheus)"
)


def _dashboard_module():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_dashboard", ROOT / "scripts" / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = ["promtool", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced, as Prometheus would receive it."""
    return expr.replace("$__rate_interval", "1m").replace("$__range", "1h").replace("$run", ".*")


def test_committed_dashboard_is_what_the_generator_makes(tmp_path: Path) -> None:
    out = tmp_path / "hpcpipe.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_dashboard.py"), str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    committed = (DEPLOY / "grafana" / "hpcpipe.json").read_text()
    assert out.read_text() == committed, "run: .venv/bin/python scripts/build_dashboard.py"
    board = json.loads(committed)
    titles = [p["title"] for p in board["panels"]]
    for needed in ("Throughput (tokens/s)", "MFU", "Loss", "Phase share of step time", "Rank imbalance",
                   "GPU utilisation", "Checkpoints committed", "Restarts"):  # fmt: skip
        assert needed in titles
    assert {a["name"] for a in board["annotations"]["list"]} >= {"Checkpoints", "Restarts"}
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "run"]


@needs_promtool
def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    exprs = _dashboard_module().all_exprs()
    board = json.loads((DEPLOY / "grafana" / "hpcpipe.json").read_text())
    in_json = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert set(in_json) | {a["expr"] for a in board["annotations"]["list"]} == set(exprs)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": concrete(e)} for i, e in enumerate(exprs)
    ]}]}  # fmt: skip
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = _promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


@needs_promtool
def test_prometheus_config_is_valid(tmp_path: Path) -> None:
    proc = _promtool("check", "config", "--syntax-only", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_docs_example_exporter_ports_miss_the_dcgm_exporter_prometheus_scrapes() -> None:
    """The example base port was 9400, dcgm-exporter's: rank 0 and DCGM fought for it."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (dcgm,) = [job for job in config["scrape_configs"] if job["job_name"] == "dcgm"]
    dcgm_port = int(dcgm["static_configs"][0]["targets"][0].rsplit(":", 1)[1])
    doc = (ROOT / "docs" / "observability.md").read_text()
    base = int(re.search(r"observe\.prometheus\.port=(\d+)", doc).group(1))  # type: ignore[union-attr]
    assert not base <= dcgm_port < base + 8  # 8 local ranks


@needs_promtool
def test_alert_rules_pass_their_unit_tests() -> None:
    proc = _promtool("test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    assert {"HpcpipeRunStalled", "HpcpipeRankImbalance", "HpcpipeGpuThrottled"} <= names
    assert {"HpcpipeGpuEccErrors", "HpcpipeCheckpointFailing"} <= names
