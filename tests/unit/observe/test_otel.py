"""OpenTelemetry traces without a training run: the ids every rank derives alike, the config's
checks, the span tree a phase timer produces (sent to a real OTLP/HTTP receiver), the trace ids
in events.jsonl, the pipeline's spans, and what an unreachable or slow collector costs."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from tests.helpers import run_cli
from tests.otlp_receiver import OtlpReceiver, Received, closed_port

from hpcpipe.config import load_config
from hpcpipe.config.observe import OtelConfig
from hpcpipe.layout import RunLayout
from hpcpipe.observe import otel_export
from hpcpipe.observe.metrics import EventLog, read_events
from hpcpipe.observe.otel_ids import (
    TRACEPARENT_VAR,
    TraceParent,
    Who,
    format_traceparent,
    launch_attempt,
    parse_traceparent,
    step_span_id,
    step_trace_id,
)
from hpcpipe.observe.otel_steps import StepTracer
from hpcpipe.observe.phases import PhaseTimer
from hpcpipe.pipeline.engine import NotApplicable, Step, StepContext, run_pipeline
from hpcpipe.pipeline.tracing import pipeline_trace

pytestmark = pytest.mark.timeout(120)

PHASES = ("data", "forward", "comm", "backward", "optimizer")


# -- ids -------------------------------------------------------------------------------------------


def test_every_rank_derives_one_trace_per_step_and_its_own_step_span() -> None:
    trace = step_trace_id("run-a", "x", 10)
    assert trace == step_trace_id("run-a", "x", 10) and 0 < trace < 2**128
    assert len({step_trace_id("run-a", "x", s) for s in range(1, 200)}) == 199
    spans = {step_span_id("run-a", "x", 10, rank) for rank in range(64)}
    assert len(spans) == 64 and all(0 < s < 2**64 for s in spans)
    # Another run, or another start of the same run (a restart), never reuses a step's ids.
    assert step_trace_id("run-b", "x", 10) != trace != step_trace_id("run-a", "y", 10)


def test_a_launch_attempt_is_shared_by_the_group_and_random_for_one_process() -> None:
    env = {"TORCHELASTIC_RUN_ID": "hpcpipe-1a2b", "TORCHELASTIC_RESTART_COUNT": "1", "RANK": "3"}
    assert (
        launch_attempt(env, 2)
        == launch_attempt(dict(env), 2)
        == ("TORCHELASTIC_RUN_ID=hpcpipe-1a2b,TORCHELASTIC_RESTART_COUNT=1")
    )
    assert launch_attempt({**env, "TORCHELASTIC_RESTART_COUNT": "2"}, 2) != launch_attempt(env, 2)
    assert launch_attempt({}, 1) != launch_attempt({}, 1)  # nobody to agree with: a fresh id


def test_traceparent_round_trips_and_junk_is_ignored() -> None:
    value = format_traceparent(0xABC, 0x12)
    assert value == f"00-{0xABC:032x}-{0x12:016x}-01"
    assert parse_traceparent(value) == TraceParent(0xABC, 0x12, sampled=True)
    for junk in (None, "", "01-" + value[3:], value[:-1], f"00-{0:032x}-{1:016x}-01", "00-zz"):
        assert parse_traceparent(junk) is None


# -- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("notaurl", "not a collector URL"),
        ("ftp://collector:4318", "not a collector URL"),
        ("http://", "not a collector URL"),
        ("http://user:secret@collector:4318", "credentials"),
        ("http://collector:4318/?key=1", "no query"),
        ("http://collector:99999", "bad port"),
    ],
)
def test_the_endpoint_must_be_a_collector_url(endpoint: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as info:
        OtelConfig(endpoint=endpoint)
    assert "secret" not in str(info.value.errors()[0]["msg"])


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("https://collector:4318/", "https://collector:4318/v1/traces"),
        ("http://gateway/otlp", "http://gateway/otlp/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ],
)
def test_the_traces_path_is_added_to_a_base_url(endpoint: str, url: str) -> None:
    assert OtelConfig(endpoint=endpoint).traces_url == url


def test_grpc_takes_the_endpoint_as_given_and_no_path() -> None:
    assert OtelConfig(endpoint="http://collector:4317", protocol="grpc").traces_url == "http://collector:4317"
    with pytest.raises(ValidationError, match="gRPC collector URL has no path"):
        OtelConfig(endpoint="http://collector:4317/v1/traces", protocol="grpc")
    assert OtelConfig().endpoint is None  # off by default


def test_an_endpoint_that_is_not_a_url_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run_cli("train", "tiny", "--set", "observe.otel.endpoint=notaurl", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "observe.otel.endpoint" in proc.stderr and "not a collector URL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from hpcpipe.config import load_config\n"
        "from hpcpipe.observe.otel import step_tracer\n"
        "import hpcpipe.train.trainer, hpcpipe.pipeline.engine\n"
        "job = load_config('tiny')\n"
        "assert step_tracer(job.observe.otel, 'r', 0, 2, 'h', None) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# -- the span tree of a phase timer ---------------------------------------------------------------


def _cfg(endpoint: str, **kw: Any) -> OtelConfig:
    return OtelConfig(endpoint=endpoint, **kw)


def _run_steps(timers: list[PhaseTimer], steps: range, logs: list[EventLog], ckpt_step: int) -> None:
    """What the trainer does, for each rank in turn: phases, then the regions after a step."""
    for step in steps:
        for rank, timer in enumerate(timers):
            timer.begin_step(step)
            for phase in PHASES:
                timer.begin(phase)
                if rank == 0 and phase == "comm":
                    logs[0].emit("oom_recovered", {"step": step})  # an event inside a phase
            timer.end_step()
            with timer.region("all_reduce_metrics"):
                pass
            if step == ckpt_step:
                with timer.region("checkpoint_save"), timer.region("broadcast_buffers"):
                    if rank == 0:  # the store's events come from rank 0 only
                        logs[0].emit("checkpoint_staged", {"step": step, "blocking_s": 0.01})
                        logs[0].emit("checkpoint_committed", {"step": step, "path": "/c", "write_s": 0.2})
        if step == ckpt_step:
            logs[0].emit("checkpoint_verified", {"step": step, "path": "/c"})


def _by_id(spans: list[Received]) -> dict[str, Received]:
    return {s.span_id: s for s in spans}


def test_two_ranks_share_a_trace_per_sampled_step_with_their_phases_under_them(tmp_path: Path) -> None:
    logs = [EventLog(tmp_path, enabled=True), EventLog(tmp_path / "unwritten", enabled=False)]
    pipeline = TraceParent(0xFEED, 0xBEEF, sampled=True)
    with OtlpReceiver() as receiver:
        cfg = _cfg(receiver.endpoint, sample_every_steps=2)
        tracers = [
            StepTracer(cfg, Who("run-a", "", rank, f"node{rank}"), logs[rank], pipeline) for rank in (0, 1)
        ]
        timers = [PhaseTimer(torch.device("cpu")) for _ in tracers]
        for timer, tracer in zip(timers, tracers, strict=True):
            timer.listeners.append(tracer)
        logs[0].emit("resumed", {"step": 0})  # no span is current yet
        _run_steps(timers, range(1, 5), logs, ckpt_step=4)
        for tracer in tracers:
            tracer.close()
        spans = receiver.received()

    steps = [s for s in spans if s.name == "train_step"]
    assert sorted((s.attributes["hpcpipe.step"], s.attributes["hpcpipe.rank"]) for s in steps) == [
        (2, 0), (2, 1), (4, 0), (4, 1)
    ]  # fmt: skip
    by_id = _by_id(spans)
    for s in steps:
        step, rank = s.attributes["hpcpipe.step"], s.attributes["hpcpipe.rank"]
        assert s.trace_id == f"{step_trace_id('run-a', '', step):032x}"
        assert s.span_id == f"{step_span_id('run-a', '', step, rank):016x}"
        assert s.parent_id == ("" if rank == 0 else f"{step_span_id('run-a', '', step, 0):016x}")
        assert s.links == ([(f"{0xFEED:032x}", f"{0xBEEF:016x}")] if rank == 0 else [])
        assert s.attributes["hpcpipe.run.id"] == "run-a" and s.attributes["host.name"] == f"node{rank}"
        under = [c for c in spans if c.parent_id == s.span_id]
        ranks_under = [c.attributes["hpcpipe.rank"] for c in under if c.name == "train_step"]
        assert ranks_under == ([1] if rank == 0 else [])
        children = [c for c in under if c.name != "train_step" and not c.name.startswith("checkpoint.")]
        names = [c.name for c in sorted(children, key=lambda c: c.start_ns)]
        regions = ["checkpoint_save"] if step == 4 else []
        assert names == [*PHASES, "all_reduce_metrics", *regions], (step, rank)
        assert all(c.trace_id == s.trace_id and c.attributes["hpcpipe.step"] == step for c in children)
        assert all(s.start_ns <= c.start_ns for c in children)
    nested = [s for s in spans if s.name == "broadcast_buffers"]
    assert len(nested) == 2 and all(by_id[s.parent_id].name == "checkpoint_save" for s in nested)

    # Checkpoint spans from rank 0's events: under rank 0's span of the step, timed by the event.
    (stage,) = [s for s in spans if s.name == "checkpoint.stage"]
    (save,) = [s for s in spans if s.name == "checkpoint.save"]
    (verify,) = [s for s in spans if s.name == "checkpoint.verify"]
    assert save.parent_id == stage.parent_id == verify.parent_id == f"{step_span_id('run-a', '', 4, 0):016x}"
    assert save.end_ns - save.start_ns == pytest.approx(0.2e9, rel=1e-3)
    assert save.attributes["hpcpipe.checkpoint.path"] == "/c" and save.attributes["hpcpipe.rank"] == 0
    assert verify.start_ns == save.end_ns  # a verification is queued at the commit

    events = {e["event"]: e for e in read_events(tmp_path)}
    assert set(events["resumed"]) == {"time", "event", "step"}  # no span current: the line as ever
    assert (events["checkpoint_committed"]["trace_id"], events["checkpoint_committed"]["span_id"]) == (
        save.trace_id, save.span_id
    )  # fmt: skip
    lines = [json.loads(line) for line in RunLayout(tmp_path).events.read_text().splitlines()]
    oom = [e for e in lines if e["event"] == "oom_recovered"]
    assert [("trace_id" in e) for e in oom] == [False, True, False, True]  # only in traced steps
    assert by_id[oom[1]["span_id"]].name == "comm" and by_id[oom[1]["span_id"]].trace_id == oom[1]["trace_id"]
    closed = events["tracing_closed"]
    assert closed["spans"] == closed["sent"] == len(spans)  # one provider: both "ranks" here
    assert closed["failed"] == closed["dropped"] == 0 and "trace_id" not in closed


def test_a_checkpoint_of_an_untraced_step_and_a_restore_are_roots_of_their_step_trace(tmp_path: Path) -> None:
    log = EventLog(tmp_path, enabled=True)
    with OtlpReceiver() as receiver:
        tracer = StepTracer(_cfg(receiver.endpoint, sample_every_steps=100), Who("r", "a", 0, "h"), log, None)
        log.emit("checkpoint_restored", {"step": 30, "path": "/c", "tier": "fast", "load_s": 0.5})
        log.emit("checkpoint_save_failed", {"step": 31, "error": "disk full"})
        tracer.close()
        spans = {s.name: s for s in receiver.received()}
    restore, failed = spans["checkpoint.restore"], spans["checkpoint.save"]
    assert restore.parent_id == "" and restore.trace_id == f"{step_trace_id('r', 'a', 30):032x}"
    assert restore.end_ns - restore.start_ns == pytest.approx(0.5e9, rel=1e-3)
    assert failed.status_code == 2 and failed.status_message == "disk full"


# -- the pipeline ----------------------------------------------------------------------------------


def test_the_pipeline_has_a_root_span_and_one_span_per_step_and_announces_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRACEPARENT_VAR, "")  # restored after the test: pipeline_trace sets it
    seen: dict[str, str] = {}

    def step(name: str, fail: bool = False) -> Step:
        def run(ctx: StepContext) -> None:
            import os

            seen[name] = os.environ[TRACEPARENT_VAR]
            if fail:
                raise RuntimeError("broke")
            if name == "register":
                raise NotApplicable("nothing to register")

        return Step(name, ("train",), (), run, lambda ctx: {}, "")

    with OtlpReceiver() as receiver:
        job = load_config("tiny", [f"run.out_dir={tmp_path}", f"observe.otel.endpoint={receiver.endpoint}"])
        ctx = StepContext(job, job.run_dir, say=lambda _: None, trace=pipeline_trace(job))
        run_pipeline([step("prepare"), step("train"), step("register")], ctx)
        announced_first = seen["train"]
        monkeypatch.setenv(TRACEPARENT_VAR, "")  # each `hpcpipe run` is a process, a trace of its own
        ctx.trace = pipeline_trace(job)
        run_pipeline([step("prepare"), step("train"), step("register")], ctx)  # all skipped
        # Started by something traced (a CI job): the pipeline continues its trace.
        monkeypatch.setenv(TRACEPARENT_VAR, format_traceparent(0xC1, 0xC2))
        ctx.trace = pipeline_trace(job)
        with pytest.raises(RuntimeError):
            run_pipeline([step("prepare"), step("train", fail=True)], ctx, start="train")
        spans = receiver.wait_for(3 + 4 + 3)
    roots = [s for s in spans if s.name == "pipeline"]
    assert len(roots) == 3 and roots[2].status_code == 2
    first = sorted((s for s in spans if s.parent_id == roots[0].span_id), key=lambda s: s.start_ns)
    assert [(s.name, s.attributes["hpcpipe.pipeline.status"]) for s in first] == [
        ("pipeline.prepare", "done"), ("pipeline.train", "done"), ("pipeline.register", "not-applicable")
    ]  # fmt: skip
    again = [s for s in spans if s.parent_id == roots[1].span_id]
    assert {s.attributes["hpcpipe.pipeline.action"] for s in again} == {"skip"}
    (train,) = [s for s in first if s.name == "pipeline.train"]
    # The workers see the train step's context in TRACEPARENT (fixed before the step starts).
    announced = TraceParent(int(train.trace_id, 16), int(train.span_id, 16), sampled=True)
    assert parse_traceparent(announced_first) == announced
    assert (roots[2].trace_id, roots[2].parent_id) == (f"{0xC1:032x}", f"{0xC2:016x}")
    assert roots[0].parent_id == roots[1].parent_id == "" and roots[0].trace_id != roots[1].trace_id
    failed = [s for s in spans if s.parent_id == roots[2].span_id and s.name == "pipeline.train"]
    assert failed[0].status_code == 2 and "broke" in failed[0].status_message
    assert failed[0].attributes["hpcpipe.pipeline.status"] == "failed"


# -- unreachable and slow collectors -----------------------------------------------------------------


def _end_spans(tracing: otel_export.Tracing, count: int) -> None:
    from opentelemetry.context import Context

    for i in range(count):
        tracing.start_span("s", Context(), {"i": i}).end()


def test_an_unreachable_collector_costs_nothing_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = EventLog(tmp_path, enabled=True)
    with closed_port() as closed, caplog.at_level(logging.WARNING, logger="hpcpipe.observe"):
        tracer = StepTracer(_cfg(closed, export_timeout_s=30), Who("r", "", 0, "h"), log, None)
        start = time.perf_counter()
        for _ in range(3):  # three batches, each sent and failed: one report
            _end_spans(tracer.tracing, 10)
            tracer.tracing.processor.force_flush()
        tracer.close()
        elapsed = time.perf_counter() - start
    assert elapsed < 2.0  # no retry with back-off for 30 s: the connect is refused at once
    kinds = [e["event"] for e in read_events(tmp_path)]
    assert kinds.count("tracing_unreachable") == 1
    (report,) = [e for e in read_events(tmp_path) if e["event"] == "tracing_unreachable"]
    assert report["endpoint"] == f"{closed}/v1/traces" and "cannot connect" in report["reason"]
    (closing,) = [e for e in read_events(tmp_path) if e["event"] == "tracing_closed"]
    assert (closing["spans"], closing["sent"], closing["failed"], closing["dropped"]) == (30, 0, 30, 0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "cannot reach" in lines[0], lines  # and no SDK retry warnings


def test_a_collector_that_never_answers_holds_the_end_no_longer_than_the_export_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        cfg = _cfg(f"http://127.0.0.1:{silent.getsockname()[1]}", export_timeout_s=1.0)
        tracing = otel_export.acquire(cfg, otel_export.resource_attributes(cfg, "r", 0, "h"), True)
        _end_spans(tracing, 5)
        start = time.perf_counter()
        counts = otel_export.release(tracing)
        # 1 s, and 2 s of slack for a busy machine: the exporter's own default would be 10 s.
        assert time.perf_counter() - start < 3.0
    assert counts.spans == 5 and counts.sent == 0


def test_a_full_queue_drops_spans_and_counts_them() -> None:
    with OtlpReceiver(delay_s=0.5) as receiver:
        attributes = otel_export.resource_attributes(_cfg(receiver.endpoint), "r", 0, "h")
        small = _cfg(receiver.endpoint, queue_size=16, export_timeout_s=5)
        tracing = otel_export.acquire(small, attributes, True)
        start = time.perf_counter()
        _end_spans(tracing, 400)  # the exporter is stuck on a slow collector: the queue overflows
        # Ending spans never waited for it: that would take 25 exports of 0.5 s (400 / 16).
        assert time.perf_counter() - start < 3.0
        counts = otel_export.release(tracing)
        received = len(receiver.received())
    assert counts.spans == 400 and counts.sent == received and counts.failed == 0
    assert counts.dropped == 400 - received > 300


def test_one_provider_per_process_is_shared_and_released_by_the_last_user() -> None:
    with OtlpReceiver() as receiver:
        cfg = _cfg(receiver.endpoint)
        attributes = otel_export.resource_attributes(cfg, "r", 0, "h")
        first = otel_export.acquire(cfg, attributes, True)
        second = otel_export.acquire(cfg, attributes, True)
        assert first is second and first.users == 2
        _end_spans(first, 3)
        assert otel_export.release(first).sent == 3  # the first release sends what is queued
        _end_spans(second, 2)
        assert otel_export.release(second).sent == 5
        assert otel_export.acquire(cfg, attributes, True) is not first  # shut down: a new one
        otel_export.release(otel_export._Process.tracing)  # type: ignore[arg-type]
        assert {s.attributes["service.name"] for s in receiver.received()} == {"hpcpipe"}


def test_grpc_spans_reach_a_grpc_collector() -> None:
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    from tests.otlp_receiver import decode

    received: list[Received] = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # the gRPC method's name
            received.extend(decode(request.SerializeToString()))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        cfg = _cfg(f"http://127.0.0.1:{port}", protocol="grpc")
        tracing = otel_export.acquire(cfg, otel_export.resource_attributes(cfg, "r", 0, "h"), True)
        _end_spans(tracing, 3)
        counts = otel_export.release(tracing)
    finally:
        server.stop(grace=None)
    assert counts.sent == 3 and sorted(s.attributes["i"] for s in received) == [0, 1, 2]


def test_tracing_on_without_the_otel_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from hpcpipe.errors import ConfigError
    from hpcpipe.observe.otel import require_otel

    real = importlib.util.find_spec

    def uninstalled(name: str, *args: Any) -> Any:
        return None if name.startswith("opentelemetry") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", uninstalled)
    with pytest.raises(ConfigError, match=r"observe.otel.endpoint .* pip install 'hpcpipe\[otel\]'"):
        require_otel(OtelConfig(endpoint="http://collector:4318"))


def test_a_user_that_is_not_the_last_leaves_a_slow_collector_sending_for_the_others() -> None:
    # `hpcpipe run` with in-process training: the trainer releases first, the pipeline goes on.
    with OtlpReceiver(delay_s=1.5) as receiver:
        cfg = _cfg(receiver.endpoint, export_timeout_s=5)
        attributes = otel_export.resource_attributes(cfg, "r", 0, "h")
        trainer = otel_export.acquire(cfg, attributes, True)
        pipeline = otel_export.acquire(cfg, attributes, True)
        _end_spans(trainer, 3)
        trainer.timeout_s = 0.2  # shorter than the collector takes: the trainer stops waiting
        start = time.perf_counter()
        otel_export.release(trainer)
        assert time.perf_counter() - start < 1.0  # 0.2 s, not the collector's 1.5
        pipeline.timeout_s = 10.0
        _end_spans(pipeline, 2)  # the pipeline's spans after training still reach the collector
        counts = otel_export.release(pipeline)
        assert (counts.spans, counts.sent, counts.failed, counts.dropped) == (5, 5, 0, 0)
        assert len(receiver.received()) == 5


def test_credentials_in_error_text_never_reach_the_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRACEPARENT_VAR, "")
    secret = "http://alice:s3cret@registry:5000/v2?access_token=tok123&page=2 (Bearer abc.def)"

    def fails(ctx: StepContext) -> None:
        raise RuntimeError(f"cannot push to {secret}")

    with OtlpReceiver() as receiver:
        job = load_config("tiny", [f"run.out_dir={tmp_path}", f"observe.otel.endpoint={receiver.endpoint}"])
        ctx = StepContext(job, job.run_dir, say=lambda _: None, trace=pipeline_trace(job))
        with pytest.raises(RuntimeError):
            run_pipeline([Step("train", (), (), fails, lambda ctx: {}, "")], ctx)
        log = EventLog(tmp_path, enabled=True)
        tracer = StepTracer(_cfg(receiver.endpoint), Who("r", "a", 0, "h"), log, None)
        log.emit("checkpoint_save_failed", {"step": 3, "error": f"upload failed: {secret}", "path": secret})
        tracer.close()
        spans = {s.name: s for s in receiver.wait_for(3)}
    step, save = spans["pipeline.train"], spans["checkpoint.save"]
    sent = [step.status_message, spans["pipeline"].status_message, save.status_message]
    sent.append(save.attributes["hpcpipe.checkpoint.path"])
    for text in sent:
        assert "registry:5000/v2?access_token=***&page=2" in text, text
        assert not any(leak in text for leak in ("alice", "s3cret", "tok123", "abc.def")), text
    assert step.status_message.startswith("RuntimeError: cannot push to http://registry:5000")


def test_a_failing_exporter_never_raises_into_the_loop_or_the_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    class Broken(SpanExporter):
        """An SDK exporter whose every call raises (the first export after a delay)."""

        delay_s = 0.0

        def export(self, spans: Any) -> Any:
            time.sleep(self.delay_s)
            raise ConnectionError("reset by http://alice:s3cret@collector")

        def shutdown(self) -> None:
            raise RuntimeError("channel already closed")

    reports: list[str] = []

    def failing_report(why: str) -> None:
        raise OSError("events.jsonl: disk full")

    with OtlpReceiver() as receiver:  # something listens: the exporter itself is tried
        monkeypatch.setattr(otel_export, "_otlp_exporter", lambda cfg, url: Broken())
        monkeypatch.setattr(otel_export, "RETRY_AFTER_S", 0.0)  # every batch is tried
        cfg = _cfg(receiver.endpoint)
        tracing = otel_export.acquire(cfg, otel_export.resource_attributes(cfg, "r", 0, "h"), False)
        tracing.exporter.on_unreachable += [failing_report, reports.append]
        _end_spans(tracing, 4)
        tracing.processor.force_flush()  # the export raises: a failed batch, reported once
        assert reports and "s3cret" not in reports[0] and "ConnectionError" in reports[0]
        with monkeypatch.context() as patch:  # the SDK's queue itself failing: the span is dropped
            patch.setattr(BatchSpanProcessor, "on_end", lambda self, span: 1 / 0)
            _end_spans(tracing, 1)
        Broken.delay_s = 0.5  # the last release runs out of time: the exporter is stopped
        tracing.timeout_s = 0.1
        _end_spans(tracing, 2)
        counts = otel_export.release(tracing)  # the export, shutdown and close raise: not here
    assert counts.spans == 7 and counts.sent == 0 and counts.failed >= 4
    assert counts.failed + counts.dropped == 7
