"""OpenTelemetry traces of real 2-rank runs, received by a real OTLP/HTTP receiver started here
(tests/otlp_receiver.py): `hpcpipe train` (one trace per sampled step, rank 1 under rank 0,
phases and regions under each rank's step, checkpoint spans, events.jsonl joined to them);
`hpcpipe run` (the pipeline's spans, linked from the workers through the fork server); and a
collector that is not there (training unharmed, said once)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets
from tests.otlp_receiver import OtlpReceiver, Received, closed_port

from hpcpipe.observe.metrics import read_events

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

PHASES = ["data", "forward", "comm", "backward", "comm", "optimizer"]
# The regions after a step (train.steps=8): the logged row's all-reduce and a checkpoint every 4
# steps, and the evaluation after the last.
REGIONS_AFTER = {
    4: ["all_reduce_metrics", "checkpoint_save"],
    8: ["all_reduce_metrics", "evaluate", "checkpoint_save"],
}


def _sets(tmp: Path, name: str, *extra: str) -> list[str]:
    return tiny_job_sets(
        tmp,
        name,
        "parallel.strategy=ddp",
        "train.steps=8",
        "observe.log_every=4",
        "checkpoint.every_steps=4",
        "observe.otel.sample_every_steps=2",
        *extra,
    )


def _train(tmp: Path, name: str, *extra: str) -> float:
    start = time.perf_counter()
    proc = run_cli("train", "tiny", "--nproc", "2", *_sets(tmp, name, *extra), cwd=tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.perf_counter() - start


def _children(spans: list[Received], parent: Received) -> list[Received]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def test_a_two_rank_run_sends_one_trace_per_sampled_step_with_both_ranks(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        _train(tmp_path, "traced", f"observe.otel.endpoint={receiver.endpoint}")
        spans = receiver.received()
    steps: dict[int, dict[int, Received]] = defaultdict(dict)
    for span in (s for s in spans if s.name == "train_step"):
        steps[span.attributes["hpcpipe.step"]][span.attributes["hpcpipe.rank"]] = span
    assert sorted(steps) == [2, 4, 6, 8] and all(sorted(ranks) == [0, 1] for ranks in steps.values())
    for step, ranks in steps.items():
        root, other = ranks[0], ranks[1]
        assert root.trace_id == other.trace_id and root.parent_id == "" and other.parent_id == root.span_id
        assert root.attributes["host.name"] and root.attributes["service.name"] == "hpcpipe"
        assert {s.attributes["hpcpipe.run.id"] for s in ranks.values()} == {"traced"}
        for rank, span in ranks.items():
            below = [c for c in _children(spans, span) if c.name != "train_step"]
            who = {(c.attributes["hpcpipe.rank"], c.attributes["hpcpipe.step"]) for c in below}
            assert who == {(rank, step)}
            names = [c.name for c in below if not c.name.startswith("checkpoint.")]
            assert names == [*PHASES, *REGIONS_AFTER.get(step, [])], (step, rank, names)
    # One span per checkpoint save (both), verify (the first: the last one's ends after training).
    saves = [s for s in spans if s.name == "checkpoint.save"]
    assert sorted(s.attributes["hpcpipe.step"] for s in saves) == [4, 8]
    assert all(s.parent_id == steps[s.attributes["hpcpipe.step"]][0].span_id for s in saves)
    assert any(s.name == "checkpoint.verify" and s.attributes["hpcpipe.step"] == 4 for s in spans)
    # events.jsonl joins its lines to those spans.
    events = read_events(tmp_path / "traced")
    committed = [e for e in events if e["event"] == "checkpoint_committed"]
    assert {(e["trace_id"], e["span_id"]) for e in committed} == {(s.trace_id, s.span_id) for s in saves}
    (closed,) = [e for e in events if e["event"] == "tracing_closed"]
    assert closed["failed"] == closed["dropped"] == 0 and closed["sent"] == closed["spans"] > 0
    assert not [e for e in events if e["event"] == "tracing_unreachable"]


def test_the_pipeline_traces_its_steps_and_the_workers_link_to_its_train_step(tmp_path: Path) -> None:
    sets = _sets(tmp_path, "piped", "train.steps=4")
    with OtlpReceiver() as receiver:
        sets += ["--set", f"observe.otel.endpoint={receiver.endpoint}"]
        proc = run_cli("run", "tiny", "--nproc", "2", *sets, cwd=tmp_path, timeout=400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans = receiver.received()
    (root,) = [s for s in spans if s.name == "pipeline"]
    names = [s.name for s in _children(spans, root)]
    expected = ("prepare", "stage", "train", "evaluate", "export", "register", "report")
    assert names == [f"pipeline.{step}" for step in expected]
    (train,) = [s for s in spans if s.name == "pipeline.train"]
    assert train.attributes["hpcpipe.pipeline.status"] == "done"
    rank0 = [s for s in spans if s.name == "train_step" and s.attributes["hpcpipe.rank"] == 0]
    assert len(rank0) == 2 and all(s.links == [(train.trace_id, train.span_id)] for s in rank0)


def test_an_unreachable_collector_leaves_training_as_fast_and_is_reported_once(tmp_path: Path) -> None:
    off = _train(tmp_path, "off")
    with closed_port() as closed:
        start = time.perf_counter()
        otel = [f"observe.otel.endpoint={closed}", "observe.otel.export_timeout_s=30"]
        sets = _sets(tmp_path, "unreachable", *otel)
        proc = run_cli("train", "tiny", "--nproc", "2", *sets, cwd=tmp_path, timeout=300)
        on = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("spans cannot reach") == 1, proc.stderr[-3000:]
    assert "opentelemetry" not in proc.stderr and "Transient error" not in proc.stderr
    events = read_events(tmp_path / "unreachable")
    assert [e["event"] for e in events].count("tracing_unreachable") == 1
    (closing,) = [e for e in events if e["event"] == "tracing_closed"]
    assert closing["sent"] == 0 and closing["failed"] + closing["dropped"] == closing["spans"] > 0
    # Closing did not wait for the collector (30 s of retries with back-off otherwise)...
    (finished,) = [e for e in events if e["event"] == "run_finished"]
    assert closing["time"] - finished["time"] < 5.0, [(e["time"], e["event"]) for e in events]
    # ... and neither did training: the whole run took about what the run without tracing took
    # (both bounds leave a busy machine's slack and stay far under the 30 s it would take).
    assert on < off + 15.0, (on, off)
