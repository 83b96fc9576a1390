"""Imbalance analysis and the bottleneck verdict on constructed timer data; `hpcpipe profile`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.observe.imbalance import FIELDS, Imbalance, analyse, next_streak
from hpcpipe.observe.verdict import Evidence, Thresholds, classify, evidence_from_rows, read_trace

NAN = math.nan


def _rank(step: float, data: float, fwd: float, bwd: float, opt: float, comm: float,
          clock: float = NAN, power: float = NAN, reasons: float = NAN) -> list[float]:  # fmt: skip
    row = [step, data, fwd, bwd, opt, comm, clock, power, reasons]
    assert len(row) == len(FIELDS)
    return row


def test_a_rank_slow_to_load_data_is_named_with_the_data_phase() -> None:
    # Synchronous DDP: equal step times; the fast ranks wait (comm) for rank 2's data.
    table = [
        _rank(0.30, 0.01, 0.05, 0.10, 0.02, 0.12),
        _rank(0.30, 0.01, 0.05, 0.10, 0.02, 0.12),
        _rank(0.30, 0.13, 0.05, 0.10, 0.02, 0.00),
        _rank(0.30, 0.01, 0.05, 0.10, 0.02, 0.12),
    ]
    result = analyse(40, table, ["a", "b", "c", "d"], threshold=0.2)
    assert result.slowest_rank == 2 and result.host == "c"
    assert result.phase == "data"
    assert result.phase_excess_s == pytest.approx(0.12)
    assert result.ratio == pytest.approx((0.30 - 0.18) / 0.18)
    assert result.over and result.cause is None
    assert "rank 2 on c is slowest, data +120.0 ms" in result.describe()


def test_a_rank_slow_to_compute_is_named_with_the_forward_phase() -> None:
    table = [_rank(0.5, 0.01, 0.35, 0.1, 0.02, 0.0), _rank(0.5, 0.01, 0.05, 0.1, 0.02, 0.3)]
    result = analyse(10, table, ["a", "b"], threshold=0.2)
    assert (result.slowest_rank, result.phase) == (0, "forward")


def test_an_even_group_is_not_flagged() -> None:
    table = [_rank(0.20, 0.01, 0.05, 0.10, 0.02, 0.01 + i * 0.002) for i in range(8)]
    result = analyse(10, table, [f"n{i}" for i in range(8)], threshold=0.2)
    assert result.ratio < 0.2 and not result.over


def test_only_the_same_rank_over_threshold_in_a_row_builds_a_streak() -> None:
    def check(slowest: int, ratio: float) -> Imbalance:
        return Imbalance(0, ratio, 0.2, slowest, "h", "data", 0.0, [], None)

    streak = (-1, 0)
    counts = []
    for slowest, ratio in [(1, 0.5), (1, 0.5), (0, 0.5), (0, 0.1), (0, 0.5), (0, 0.5), (0, 0.5)]:
        streak = next_streak(streak, check(slowest, ratio))
        counts.append(streak[1])
    assert counts == [1, 2, 1, 0, 1, 2, 3]


def test_a_throttled_gpu_is_named_as_the_cause() -> None:
    table = [
        _rank(0.3, 0.0, 0.05, 0.20, 0.02, 0.0, clock=1.2e9, power=700, reasons=0x40),
        _rank(0.3, 0.0, 0.05, 0.10, 0.02, 0.1, clock=1.98e9, power=500, reasons=0),
        _rank(0.3, 0.0, 0.05, 0.10, 0.02, 0.1, clock=1.98e9, power=500, reasons=0),
    ]
    result = analyse(10, table, ["a", "b", "c"], threshold=0.2)
    assert result.slowest_rank == 0 and result.phase == "backward"
    assert result.cause == "GPU throttled (hw_thermal): SM clock 1200 MHz vs median 1980 MHz, 700 W"
    # A low clock alone (no reason bit) also counts; unknown clocks (NaN) never do.
    table[0][-1] = 0
    assert "low clock" in (analyse(10, table, ["a", "b", "c"], 0.2).cause or "")
    cpu = [_rank(0.3, 0.0, 0.05, 0.2, 0.02, 0.0), _rank(0.3, 0.0, 0.05, 0.1, 0.02, 0.1)]
    assert analyse(10, cpu, ["a", "b"], 0.2).cause is None


def _evidence(
    data: float = 0.0,
    comm: float = 0.0,
    other: float = 0.0,
    busy: float | None = None,
) -> Evidence:
    compute = 1.0 - data - comm - other
    shares = {"data": data, "forward": compute / 3, "backward": compute / 2, "optimizer": compute / 6,
              "comm": comm, "other": other}  # fmt: skip
    source = "nvml" if busy else None
    return Evidence(rows=5, step_time_s=0.1, shares=shares, gpu_busy=busy, gpu_busy_source=source)


@pytest.mark.parametrize(
    ("evidence", "kind"),
    [
        (_evidence(data=0.30), "input-bound"),
        (_evidence(comm=0.45, data=0.02), "communication-bound"),
        (_evidence(other=0.40), "host/launch-bound"),
        (_evidence(other=0.05, busy=0.35), "host/launch-bound"),
        (_evidence(data=0.03, comm=0.10, other=0.05, busy=0.95), "compute-bound"),
        # Both over: the one furthest over its threshold wins (data 0.10/0.05 = 2 < comm 0.6/0.2 = 3).
        (_evidence(data=0.10, comm=0.60), "communication-bound"),
    ],
)
def test_verdict_on_constructed_timers(evidence: Evidence, kind: str) -> None:
    verdict = classify(evidence, Thresholds())
    assert verdict.kind == kind
    assert verdict.knobs


def test_thresholds_are_configurable() -> None:
    evidence = _evidence(data=0.08)
    assert classify(evidence, Thresholds()).kind == "input-bound"
    assert classify(evidence, Thresholds(input_share=0.10)).kind == "compute-bound"


def test_evidence_drops_the_warm_up_row_and_averages_the_rest() -> None:
    rows = [
        {"step": 1, "loss": 5, "step_time_s": 9.0, "data_time_s": 9.0},
        {"step": 2, "loss": 4, "step_time_s": 0.1, "data_time_s": 0.05, "forward_time_s": 0.02,
         "backward_time_s": 0.02, "optimizer_time_s": 0.01, "comm_time_s": 0.0, "mfu": 0.2},
        {"step": 3, "loss": 4, "step_time_s": 0.1, "data_time_s": 0.05, "forward_time_s": 0.02,
         "backward_time_s": 0.02, "optimizer_time_s": 0.01, "comm_time_s": 0.0, "mfu": 0.4},
    ]  # fmt: skip
    ev = evidence_from_rows(rows)
    assert ev.rows == 2
    assert ev.shares["data"] == pytest.approx(0.5)
    assert ev.mfu == pytest.approx(0.3)
    assert ev.shares["other"] == pytest.approx(0.0)


def test_trace_gpu_busy_counts_overlapping_kernels_once(tmp_path: Path) -> None:
    events = [
        {"name": "ProfilerStep#5", "ph": "X", "ts": 0, "dur": 1000, "cat": "user_annotation"},
        {"name": "ProfilerStep#6", "ph": "X", "ts": 1000, "dur": 1000, "cat": "user_annotation"},
        {"name": "gemm", "ph": "X", "ts": 100, "dur": 600, "cat": "kernel"},
        {"name": "nccl", "ph": "X", "ts": 500, "dur": 400, "cat": "kernel"},  # overlaps gemm
        {"name": "gemm", "ph": "X", "ts": 1200, "dur": 300, "cat": "kernel"},
        {"name": "aten::mm", "ph": "X", "ts": 90, "dur": 700, "cat": "cpu_op"},
        {"name": "aten::add", "ph": "X", "ts": 900, "dur": 100, "cat": "cpu_op"},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    busy, ops = read_trace(path)
    assert busy == pytest.approx((800 + 300) / 2000)  # [100, 900] and [1200, 1500]
    assert ops[0] == ("aten::mm", pytest.approx(0.0007))


def test_top_operators_are_ranked_by_self_time(tmp_path: Path) -> None:
    """Inclusive times counted a nested call at every level: a layer norm's backward 168 ms three times."""

    def op(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, object]:
        return {"name": name, "ph": "X", "cat": "cpu_op", "ts": ts, "dur": dur, "pid": 7, "tid": tid}

    events = [
        op("aten::layer_norm", 0, 1000),
        op("aten::native_layer_norm", 0, 900),  # starts with its parent
        op("aten::empty", 100, 50),
        op("aten::mul", 300, 400),
        op("aten::linear", 1000, 300),  # starts as layer_norm ends: its sibling
        op("aten::mm", 10, 600, tid=2),  # another thread: nested in nothing
    ]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    _, ops = read_trace(tmp_path / "t.json")
    self_us = {"aten::mm": 600, "aten::native_layer_norm": 450, "aten::mul": 400, "aten::linear": 300,
               "aten::layer_norm": 100, "aten::empty": 50}  # fmt: skip
    assert dict(ops) == pytest.approx({name: us / 1e6 for name, us in self_us.items()})
    assert ops[0][0] == "aten::mm"


def test_profile_cli_prints_the_verdict_and_writes_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    times = {"step_time_s": 0.2, "data_time_s": 0.12, "forward_time_s": 0.03, "backward_time_s": 0.03,
             "optimizer_time_s": 0.01, "comm_time_s": 0.0}  # fmt: skip
    rows = [{"step": s, "loss": 3.0, **times} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_cli("profile", str(run), "--json", str(tmp_path / "v.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "verdict: input-bound" in proc.stdout
    assert "data.num_workers" in proc.stdout
    assert json.loads((tmp_path / "v.json").read_text())["verdict"] == "input-bound"
    assert json.loads((tmp_path / "v.json").read_text())["trace"] is None
    # To standard output: the JSON alone (the table, evidence and knobs came first), naming its trace.
    trace = run / "profile" / "rank0.steps2-3.trace.json"
    trace.parent.mkdir()
    trace.write_text(json.dumps([{"name": "ProfilerStep#2", "ph": "X", "ts": 0, "dur": 1000}]))
    piped = run_cli("profile", str(run), "--json", "-", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["trace"] == str(trace)
    bad = run_cli("profile", str(tmp_path / "nope"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "nope" in bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = run_cli("profile", str(empty), cwd=tmp_path)
    assert none.returncode == 2 and "metrics.jsonl" in none.stderr
    zero = run_cli("profile", str(run), "--comm-share", "0", cwd=tmp_path)  # a ZeroDivisionError traceback
    assert zero.returncode == 2 and zero.stderr.startswith("error: --comm-share 0: give a share above 0")


def test_a_trace_saved_as_the_bare_array_of_events_is_read(tmp_path: Path) -> None:
    """Chrome's trace format allows a top-level array: it ended `hpcpipe profile` in AttributeError."""
    events = [
        {"name": "ProfilerStep#1", "ph": "X", "ts": 0, "dur": 1000},
        {"name": "aten::mm", "ph": "X", "cat": "cpu_op", "ts": 10, "dur": 400},
        "not an event",
    ]
    bare, wrapped = tmp_path / "bare.json", tmp_path / "wrapped.json"
    bare.write_text(json.dumps(events))
    wrapped.write_text(json.dumps({"traceEvents": events}))
    assert read_trace(bare) == read_trace(wrapped)
    (tmp_path / "odd.json").write_text('{"traceEvents": 3}')
    with pytest.raises(ValueError, match="no list of trace events"):
        read_trace(tmp_path / "odd.json")


def test_a_resumed_run_is_judged_by_its_last_start(tmp_path: Path) -> None:
    """The attempt before a resume (its slow data, its trace) decided the verdict of the run after."""
    from hpcpipe.observe.verdict import Thresholds, profile_run

    def row(step: int, data: float, at: float) -> dict[str, float]:
        return {"step": step, "loss": 3.0, "step_time_s": 0.1, "data_time_s": data, "forward_time_s": 0.03,
                "backward_time_s": 0.05, "optimizer_time_s": 0.01, "time": at}  # fmt: skip

    rows = [row(s, 0.05, 100 + s) for s in range(1, 11)] + [row(s, 0.001, 300 + s) for s in range(11, 31)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    starts = [{"event": "group_start", "time": 99.0}, {"event": "group_start", "time": 300.0}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in starts))
    verdict, _ = profile_run(tmp_path, Thresholds(0.05, 0.2, 0.15, 0.8))
    assert verdict.kind != "input-bound" and verdict.evidence.rows == 19  # 20 rows, the first dropped
    # Started again once finished: that start trained nothing; the last that did is judged.
    with (tmp_path / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({"event": "group_start", "time": 500.0}) + "\n")
    assert profile_run(tmp_path, Thresholds(0.05, 0.2, 0.15, 0.8))[0].evidence.rows == 19


def test_an_evaluation_inside_the_traced_steps_is_marked_and_left_out(tmp_path: Path) -> None:
    """The traced steps held the evaluation and checkpoint save that fell in the window: their
    forwards were most of the "top operators" and of the GPU busy figure."""
    import torch

    from hpcpipe.config.observe import ProfileConfig
    from hpcpipe.observe.trace import StepProfiler

    profiler = StepProfiler(ProfileConfig(start_step=2, warmup=1, active=2), 0, tmp_path, torch.device("cpu"))
    profiler.start(1)
    for step in (1, 2, 3):
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # the step's work
        if step == 2:
            profiler.phase_begin("evaluate")
            for _ in range(20):
                torch.addmm(torch.ones(64, 64), torch.ones(64, 64), torch.ones(64, 64))  # the evaluation's
            profiler.phase_end("evaluate")
        profiler.step()
    profiler.close()
    assert profiler.trace_path is not None
    _, ops = read_trace(profiler.trace_path)
    names = [name for name, _ in ops]
    assert "aten::mm" in names and "aten::addmm" not in names
