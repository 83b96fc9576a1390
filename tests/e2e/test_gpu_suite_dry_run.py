"""``benchmarks/gpu_suite.py --cpu-dry-run``: the GPU checklist's steps at toy size on the CPU, so the
suite is known to work before a GPU machine runs it.

One dry run of every step: each must PASS, or say DRY-RUN where its subject needs CUDA (a real
CUDA OOM, NVML gauges, CUDA workers, GPU tensors, doctor's GPU rows), or SKIP only where this
machine lacks what the step needs (the test computes which); none may FAIL, the exit code is 0,
and summary.json, each step's JSON, the table and the JSON line agree. A second, short run breaks
one step on purpose: it is reported FAIL with the CLI's one-line error, the step after it still
runs and passes, and the exit code is 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "benchmarks" / "gpu_suite.py"
SMOLLM2 = REPO / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
BUDGET_S = 1200  # the suite's own limit; about 4-10 minutes on 2 cores shared with other jobs
DRY_RUN = {"doctor", "oom", "nvml", "checkpoint", "forkserver"}  # their subject needs CUDA

pytestmark = pytest.mark.timeout(BUDGET_S + 300)


def _missing(*modules: str) -> str | None:
    gone = [m for m in modules if find_spec(m) is None]
    return f"needs {', '.join(gone)}" if gone else None


def _skip_reason(step: str) -> str | None:
    """What this machine lacks for ``step`` (then the suite must SKIP it, saying so), or None."""
    if step == "deepspeed":
        return _missing("deepspeed")
    if step == "lora-qwen2-7b":
        return _missing("peft")
    if step == "lora-smollm2":
        return "no SmolLM2 model" if not SMOLLM2.is_file() else _missing("peft", "gguf", "accelerate")
    return None


def _run_suite(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SUITE), "--cpu-dry-run", "--out", str(out), *args]
    return subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=BUDGET_S + 240, check=False
    )


def _steps() -> list[str]:
    listed = subprocess.run(
        [sys.executable, str(SUITE), "--list"], capture_output=True, text=True, check=True
    )
    return [line.split()[0] for line in listed.stdout.splitlines()]


def test_the_dry_run_runs_every_step_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    started = time.perf_counter()
    proc = _run_suite(out, "--prepared-dir", str(tmp_path / "prepared"), "--budget", str(BUDGET_S))
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    print(f"dry run: {seconds:.0f} s")

    steps = _steps()
    assert len(steps) == 13 and steps[0] == "prepare" and steps[-1] == "forkserver"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "cpu-dry-run"
    assert summary["failed"] == []
    assert [s["step"] for s in summary["steps"]] == steps  # every step, in order
    for entry in summary["steps"]:
        name, status = entry["step"], entry["status"]
        skip = _skip_reason(name)
        if skip:
            assert status == "SKIP" and skip in entry["reason"], entry
            continue
        assert status == ("DRY-RUN" if name in DRY_RUN else "PASS"), entry
        assert entry["figure"], entry  # every step that ran says what it measured or saw
        record = json.loads((out / f"{name}.json").read_text())
        assert record["status"] == status and record["mode"] == "cpu-dry-run"
        assert record["commands"], name  # it ran something, and its log is kept
        for command in record["commands"]:
            assert command["rc"] == 0 and (out / command["log"]).is_file(), command
    assert sum(summary["counts"].values()) == len(steps)

    # What the dry run checked, read back: the injected OOM was recovered, the exporter was
    # scraped while the run trained, the fork server forked the worker, the checkpoint restored.
    oom = json.loads((out / "oom.json").read_text())["data"]
    assert oom["oom_events"][0]["old_micro_batch_size"] == 2 * oom["oom_events"][0]["new_micro_batch_size"]
    nvml = json.loads((out / "nvml.json").read_text())["data"]
    assert nvml["scrapes"] >= 2 and nvml["scrapes_with_gpu"] == 0 and nvml["gpu_telemetry_off"]["reason"]
    fork = json.loads((out / "forkserver.json").read_text())["data"]
    assert fork["server"]["libcuda"] is False and fork["workers"]
    assert json.loads((out / "checkpoint.json").read_text())["data"]["restored_equal"] is True

    lines = proc.stdout.strip().splitlines()
    table = "\n".join(lines[-len(steps) - 4 :])
    assert "CPU DRY RUN" in table and all(f"\n{name} " in table for name in steps)
    record = json.loads(lines[-1])  # the harness's JSON line comes last
    assert record["benchmark"] == "gpu_suite" and record["mode"] == "cpu-dry-run"
    assert record["statuses"] == {s["step"]: s["status"] for s in summary["steps"]}
    assert record["torch"] and record["cpu_model"]  # the run's context


def test_a_broken_step_fails_alone_and_the_exit_code_says_so(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    proc = _run_suite(out, "--only", "doctor,compute", "--break-step", "doctor", "--budget", "300")
    assert proc.returncode == 1, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == ["doctor"]
    doctor, compute = summary["steps"]
    assert doctor["status"] == "FAIL"
    assert (
        "exited 2" in doctor["reason"] and "No such option: --gpu-suite-broken-on-purpose" in doctor["reason"]
    )
    assert compute["status"] == "PASS" and compute["figure"]  # the step after it still ran
    assert "FAIL" in proc.stdout and "1 FAIL" in proc.stdout


def test_without_a_gpu_the_suite_refuses_to_pretend(tmp_path: Path) -> None:
    if (
        subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True, check=False).returncode
        == 0
    ):
        pytest.skip("this machine has nvidia-smi: the suite would run its GPU steps")
    proc = subprocess.run(
        [sys.executable, str(SUITE), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "--cpu-dry-run" in proc.stderr
    assert not (tmp_path / "x").exists()
