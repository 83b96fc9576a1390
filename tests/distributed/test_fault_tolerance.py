"""Preemption of whole runs: 2 gloo ranks started by `hpcpipe train`, SIGTERM injected through
HPCPIPE_CHAOS_SIGTERM, the rerun (on 2 ranks, or resharded onto 1) checked against an
uninterrupted run. A killed rank, a damaged checkpoint, an OOM and a stalled rank are the
shipped chaos scenarios' (tests/distributed/test_chaos_training.py and test_chaos_saving.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.observe.metrics import read_metrics
from hpcpipe.train.preempt import PREEMPT_EXIT_CODE

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def _train(tmp: Path, name: str, *extra: str, nproc: int = 2, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    sets = tiny_job_sets(tmp, name, "parallel.strategy=ddp")
    return run_cli("train", "tiny", "--nproc", str(nproc), *sets, *extra, cwd=tmp, timeout=240, env=env)


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def _events(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos")


@pytest.fixture(scope="module")
def reference(tmp: Path) -> dict[int, float]:
    proc = _train(tmp, "reference")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = _losses(tmp / "reference")
    assert sorted(losses) == list(range(1, 21))
    return losses


def test_checkpoint_from_two_ranks_resumes_on_one(tmp: Path, reference: dict[int, float]) -> None:
    sets = ["--set", "checkpoint.every_steps=100"]
    proc = _train(tmp, "reshard", *sets, env={"HPCPIPE_CHAOS_SIGTERM": "step=10,rank=0"})
    assert proc.returncode == PREEMPT_EXIT_CODE, proc.stderr[-3000:]
    assert (tmp / "reshard" / "checkpoints" / "step-00000010" / "manifest.json").is_file()
    preempted = [e for e in _events(tmp / "reshard") if e["event"] == "preempted"]
    assert preempted and preempted[0]["step"] == 10 and preempted[0]["signal"] == "SIGTERM"
    again = _train(tmp, "reshard", *sets, nproc=1)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [e for e in _events(tmp / "reshard") if e["event"] == "resumed"][-1]
    assert (resumed["step"], resumed["saved_world_size"], resumed["world_size"]) == (10, 2, 1)
    losses = _losses(tmp / "reshard")
    # Same global batches, one rank accumulating instead of two all-reducing: float-order close.
    assert [losses[s] for s in range(11, 21)] == pytest.approx(
        [reference[s] for s in range(11, 21)], rel=1e-3
    )


def test_sigterm_checkpoints_exits_75_and_the_rerun_resumes_exactly(
    tmp: Path, reference: dict[int, float]
) -> None:
    """Workers started fresh (parallel.worker_start=spawn) preempted, the rerun's forked from the
    fork server (the default, as the reference's): the same steps, and a checkpoint one wrote
    resumes in the other. (The SIGTERM to rank 0 of forked workers, its checkpoint and its event
    naming the signal: test_checkpoint_from_two_ranks_resumes_on_one. This test and
    test_spawned_workers_preempt_and_forked_workers_resume_on_the_same_curve were two preempted
    runs and two reruns of the same job: folded into one.)"""
    sets = ["--set", "checkpoint.every_steps=100"]  # only the preemption checkpoint
    spawned = ["--set", "parallel.worker_start=spawn"]
    run_dir = tmp / "spawned"
    proc = _train(tmp, "spawned", *sets, *spawned, env={"HPCPIPE_CHAOS_SIGTERM": "step=5,rank=1"})
    assert proc.returncode == PREEMPT_EXIT_CODE, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (run_dir / "checkpoints" / "step-00000005" / "manifest.json").is_file()
    # Rank 0 writes the event: the signal rank 1 got is on it too (it was null: rank 0 got none).
    preempted = [e for e in _events(run_dir) if e["event"] == "preempted"]
    assert [(e["step"], e["signal"], e["signalled_here"]) for e in preempted] == [(5, "SIGTERM", False)]

    again = _train(tmp, "spawned", *sets)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _losses(run_dir) == reference
