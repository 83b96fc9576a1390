"""Observability in real runs: 2 gloo ranks started by `hpcpipe train`, a straggler injected
through HPCPIPE_CHAOS_SLOW into one worker's data path or compute; the profiler window; the
verdict on a run made input-bound on purpose."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.observe.metrics import read_events, read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

CHECK_EVERY = 10  # observe.imbalance.every_steps in these runs
WARMUP = 10


def _train(  # type: ignore[no-untyped-def]
    tmp: Path, name: str, *extra: str, nproc: int = 2, env: dict[str, str] | None = None, quiet: bool = False
):
    sets = tiny_job_sets(
        tmp,
        name,
        "parallel.strategy=ddp",
        "train.steps=40",
        "observe.log_every=10",  # each check compares 10-step means: less noise than one step
        f"observe.imbalance.every_steps={CHECK_EVERY}",
        f"observe.imbalance.warmup_steps={WARMUP}",
        *extra,
    )
    # quiet: ahead of the other test worker's processes in the scheduler (root may raise its own
    # priority), as on a machine that runs this job alone; elsewhere it runs at normal priority.
    nice = ["nice", "-n", "-10"] if quiet and os.geteuid() == 0 and shutil.which("nice") else []
    proc = run_cli("train", "tiny", "--nproc", str(nproc), *sets, cwd=tmp, timeout=300, env=env, prefix=nice)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _imbalance_events(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in read_events(run_dir) if e["event"] == "imbalance"]


def test_a_rank_slow_to_load_data_is_named_at_its_second_check_in_a_row(tmp_path: Path) -> None:
    env = {"HPCPIPE_CHAOS_SLOW": "rank=1,where=data,seconds=0.08"}
    proc = _train(tmp_path, "slow-data", "observe.profile.start_step=5", env=env)
    run = tmp_path / "slow-data"
    events = _imbalance_events(run)
    assert events, proc.stderr[-2000:]
    first = events[0]
    # Checks at 20 (steps 11..20, the first after the warm-up) and 30: consecutive=2 by default.
    assert [e["step"] for e in events] == [30, 40]
    assert [e["streak"] for e in events] == [2, 3]
    assert (first["slowest_rank"], first["phase"]) == (1, "data")
    assert first["host"] and first["ratio"] > 0.2
    assert first["phase_excess_s"] > 0.02
    assert all((e["slowest_rank"], e["phase"]) == (1, "data") for e in events)
    assert "rank 1 on" in proc.stderr and "is slowest, data" in proc.stderr
    assert "(2 checks in a row)" in proc.stderr
    rows = [r for r in read_metrics(run) if "loss" in r]
    checked = [r for r in rows if "imbalance" in r]
    assert [r["step"] for r in checked] == [20, 30, 40]
    assert all(r["slowest_rank"] == 1 for r in checked)
    # Rank 0 waited for rank 1: its exposed communication carries the delay.
    assert all(r["comm_time_s"] > 0.04 for r in rows[1:])
    # The profiler window of rank 0 (steps 5..7 by default): a Chrome trace that parses.
    (trace,) = (run / "profile").glob("rank0.*.trace.json")
    assert trace.name == "rank0.steps5-7.trace.json"
    events_in_trace = json.loads(trace.read_text())["traceEvents"]
    steps = {e["name"] for e in events_in_trace if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"}
    assert not list((run / "profile").glob("rank1.*"))  # observe.profile.ranks defaults to [0]
    verdict = run_cli("profile", str(run), cwd=tmp_path)
    assert verdict.returncode == 0, verdict.stderr
    assert "straggler: rank 1" in verdict.stdout


def test_a_rank_slow_to_compute_is_named_with_its_forward_phase(tmp_path: Path) -> None:
    env = {"HPCPIPE_CHAOS_SLOW": "rank=0,where=forward,seconds=0.08"}
    _train(tmp_path, "slow-fwd", env=env)
    events = _imbalance_events(tmp_path / "slow-fwd")
    assert events
    assert {(e["slowest_rank"], e["phase"]) for e in events} == {(0, "forward")}


def test_an_even_run_raises_no_imbalance_event(tmp_path: Path) -> None:
    # 32 sequences per rank per step: ~20-30 ms of busy time. On a 2-core machine shared with
    # another test file's processes, one interval can read over 20% (CI saw 23% once at step 20),
    # and two in a row did happen (0.47 at step 40 after 30, twice in 2026-11-25's runs, with the
    # neighbour's 2-rank jobs in bursts): the machine's noise, not the product's. So the even run
    # goes ahead of the neighbour in the scheduler (quiet) and asks for three readings in a row
    # before an event (observe.imbalance.consecutive=3, four checks); what the product promises is
    # checked: no event, and the readings in the metrics agree with that rule.
    sets = ["train.micro_batch_size=32", "train.global_batch_size=64", "observe.imbalance.consecutive=3"]
    _train(tmp_path, "even", *sets, "train.steps=50", quiet=True)
    run = tmp_path / "even"
    assert _imbalance_events(run) == []
    checked = [r for r in read_metrics(run) if "imbalance" in r]
    assert [r["step"] for r in checked] == [20, 30, 40, 50]
    over = [(r["imbalance"] > 0.2, r["slowest_rank"]) for r in checked]
    assert not any(a == b == c and a[0] for a, b, c in zip(over, over[1:], over[2:], strict=False)), checked


def test_a_slow_loader_makes_the_verdict_input_bound(tmp_path: Path) -> None:
    env = {"HPCPIPE_CHAOS_SLOW": "where=data,seconds=0.05"}
    _train(tmp_path, "input-bound", nproc=1, env=env)
    proc = run_cli("profile", str(tmp_path / "input-bound"), "--json", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert verdict["verdict"] == "input-bound"
    assert verdict["evidence"]["shares"]["data"] > 0.2  # 50 ms a step; compute slows under load
    assert any("num_workers" in knob for knob in verdict["knobs"])
