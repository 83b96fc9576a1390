"""`hpcpipe accept` end to end on CPU: the shipped CPU thresholds pass; impossible ones fail by name."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_cpu_thresholds_pass_end_to_end(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "acceptance"
    proc = cli("accept", "--thresholds", "cpu", "--out", str(out), cwd=tmp_path, timeout=290)
    report = json.loads((out / "acceptance.json").read_text())
    failed = [r["detail"] for r in report["rows"] if not r["passed"]]
    assert proc.returncode == 0, (failed, proc.stdout[-3000:], proc.stderr[-3000:])
    assert report["passed"] and report["counts"]["rows"] == 9
    assert [r["section"] for r in report["rows"]] == (
        ["connectivity"] * 2 + ["collectives"] * 3 + ["compute"] * 2 + ["throughput", "scaling"]
    )
    assert report["measurements"]["connectivity"]["hosts"] == [socket.gethostname()]
    assert (out / "acceptance.md").read_text().startswith("# Acceptance: PASS (9/9 rows pass)")
    assert (out / "scaling.png").is_file() and (
        out / "runs" / "tiny-throughput-0" / "metrics.jsonl"
    ).is_file()
    assert "PASS" in proc.stdout


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_impossible_thresholds_fail_and_name_the_rank(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    thresholds = tmp_path / "impossible.yaml"
    thresholds.write_text(
        "name: impossible\nnproc: 2\nbackend: gloo\nconnectivity: {min_world_size: 2}\n"
        "collectives: {warmup: 1, iters: 2, busbw_gbps: {all_reduce: {64K: 1000000}}}\n"
    )
    out = tmp_path / "acceptance"
    proc = cli("accept", "-t", str(thresholds), "--out", str(out), "--json", "-", cwd=tmp_path, timeout=110)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # --json - prints only the JSON
    assert not report["passed"] and report["counts"] == {"rows": 2, "passed": 1, "failed": 1}
    row = report["rows"][1]
    assert row["check"] == "all_reduce busbw @ 64K" and not row["passed"]
    assert "vs required >= 1e+06 GB/s; slowest: rank" in row["detail"]
    assert f"on {socket.gethostname()}" in row["detail"]
    assert "**FAIL**" in (out / "acceptance.md").read_text()
