"""How many local ranks an acceptance run will start at most, and what their server imports
(``accept/suite.py``): the server is forked from ``hpcpipe accept`` before it measures anything."""

from __future__ import annotations

from typing import Any

import pytest

from hpcpipe.accept.suite import _training_preload, most_local_ranks
from hpcpipe.accept.thresholds import Thresholds
from hpcpipe.launch.job import WORKER_MODULE, WORKER_PRELOAD

THROUGHPUT = {"preset": "tiny", "min_per_s_per_device": 1.0}
SCALING = {"preset": "tiny", "nproc": [1, 2, 4], "min_efficiency": 0.5}


def _th(**sections: Any) -> Thresholds:
    return Thresholds.model_validate({"name": "t", "nproc": 2, **sections})


@pytest.mark.parametrize(
    ("sections", "nproc", "benchmarks", "expected"),
    [
        ({}, None, True, 2),  # the benchmark workers: the file's nproc
        ({}, 3, True, 3),  # --nproc wins
        ({}, None, False, 1),  # nothing to start
        ({"throughput": {**THROUGHPUT, "nproc": 6}}, None, True, 6),
        ({"throughput": {**THROUGHPUT, "nproc": 6}}, 1, False, 1),  # --nproc overrides the section's
        ({"scaling": SCALING}, None, False, 4),  # the largest world size of the scaling runs
    ],
)
def test_most_local_ranks(
    sections: dict[str, Any], nproc: int | None, benchmarks: bool, expected: int
) -> None:
    assert most_local_ranks(_th(**sections), nproc, benchmarks) == expected


def test_the_server_imports_the_trainer_only_when_a_section_trains() -> None:
    assert _training_preload(_th()) == ()
    for trains in ({"throughput": THROUGHPUT}, {"scaling": SCALING}):
        assert _training_preload(_th(**trains)) == (WORKER_MODULE, *WORKER_PRELOAD)


def test_a_refusal_keeps_what_was_measured_before_it_and_the_report_is_still_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A refused task ended `accept` with exit 2 and no report; then every section carried its
    error, the connectivity measured before it lost."""
    from hpcpipe.accept import suite
    from hpcpipe.bench import runner

    connectivity = {"world_size": 2, "hosts": ["h"], "ranks": []}

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise runner.BenchRefused("collectives: refused", {"connectivity": connectivity})

    monkeypatch.setattr(runner, "run_bench", refuse)
    monkeypatch.setattr(runner, "prestart_bench_server", lambda *a, **k: None)
    th = _th(collectives={"busbw_gbps": {"all_reduce": {"4G": 0.01}}}, connectivity={"max_rtt_ms": 5})
    measured = suite.measure(th, None, tmp_path)
    assert measured == {"connectivity": connectivity, "collectives": {"error": "collectives: refused"}}


def test_accept_asks_the_collectives_to_skip_sizes_beyond_memory() -> None:
    """A size that does not fit fails its own rows (``bench.collectives`` lists it as unfit)."""
    from hpcpipe.accept.suite import bench_tasks

    th = _th(collectives={"busbw_gbps": {"all_reduce": {"4G": 0.01, "1M": 0.01}}})
    assert bench_tasks(th)["collectives"]["skip_unfit"] is True


def test_accept_scaling_trains_no_no_sync_twins(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No accept row reads exposed communication: the twins doubled the section's runs (and
    DeepSpeed refuses them)."""
    from hpcpipe.accept import suite
    from hpcpipe.bench import scaling

    calls: list[dict[str, Any]] = []

    def run_scaling(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return {"rows": []}

    monkeypatch.setattr(scaling, "run_scaling", run_scaling)
    monkeypatch.setattr("hpcpipe.report.plots_bench.plot_scaling", lambda rows, path: path)
    suite._scaling(_th(scaling=SCALING), tmp_path)
    assert calls == [{"bottlenecks": False}]
