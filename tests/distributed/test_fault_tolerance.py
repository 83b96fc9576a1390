"""Chaos tests of whole runs: 2 gloo ranks started by `hpcpipe train`, faults injected through
HPCPIPE_CHAOS_* variables into the real workers, recovery checked against an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.observe.metrics import read_metrics
from hpcpipe.observe.watchdog import HANG_EXIT_CODE
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


def test_sigkill_of_a_worker_restarts_and_resumes_exactly(tmp: Path, reference: dict[int, float]) -> None:
    chaos_dir = tmp / "kill-markers"
    chaos_dir.mkdir()
    env = {"HPCPIPE_CHAOS_KILL": "step=12,rank=1", "HPCPIPE_CHAOS_DIR": str(chaos_dir)}
    proc = _train(tmp, "killed", "--max-restarts", "1", "--set", "checkpoint.every_steps=5", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = [e["event"] for e in _events(tmp / "killed")]
    assert "restart" in kinds
    resumed = [e for e in _events(tmp / "killed") if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == 10
    assert _losses(tmp / "killed") == reference  # bitwise, steps 11..20 included


def test_sigterm_checkpoints_exits_75_and_the_rerun_resumes_exactly(
    tmp: Path, reference: dict[int, float]
) -> None:
    sets = ["--set", "checkpoint.every_steps=100"]  # only the preemption checkpoint
    proc = _train(tmp, "preempted", *sets, env={"HPCPIPE_CHAOS_SIGTERM": "step=7,rank=0"})
    assert proc.returncode == PREEMPT_EXIT_CODE, proc.stderr[-3000:]
    run_dir = tmp / "preempted"
    assert (run_dir / "checkpoints" / "step-00000007" / "manifest.json").is_file()
    preempted = [e for e in _events(run_dir) if e["event"] == "preempted"]
    assert preempted and preempted[0]["step"] == 7 and preempted[0]["signal"] == "SIGTERM"

    again = _train(tmp, "preempted", *sets)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _losses(run_dir) == reference


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp: Path, reference: dict[int, float]) -> None:
    sets = ["--set", "checkpoint.every_steps=4"]
    proc = _train(tmp, "corrupt", *sets, env={"HPCPIPE_CHAOS_SIGTERM": "step=10,rank=1"})
    assert proc.returncode == PREEMPT_EXIT_CODE, proc.stderr[-3000:]
    newest = tmp / "corrupt" / "checkpoints" / "step-00000010"
    shard = next(newest.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the middle of a shard
    shard.write_bytes(bytes(data))

    again = _train(tmp, "corrupt", *sets)
    assert again.returncode == 0, again.stderr[-3000:]
    fallbacks = [e for e in _events(tmp / "corrupt") if e["event"] == "checkpoint_fallback"]
    assert fallbacks and fallbacks[0]["step"] == 10 and shard.name in json.dumps(fallbacks[0])
    resumed = [e for e in _events(tmp / "corrupt") if e["event"] == "resumed"]
    assert resumed[-1]["step"] == 8
    assert _losses(tmp / "corrupt") == reference


def test_checkpoint_from_two_ranks_resumes_on_one(tmp: Path, reference: dict[int, float]) -> None:
    sets = ["--set", "checkpoint.every_steps=100"]
    proc = _train(tmp, "reshard", *sets, env={"HPCPIPE_CHAOS_SIGTERM": "step=10,rank=0"})
    assert proc.returncode == PREEMPT_EXIT_CODE, proc.stderr[-3000:]
    again = _train(tmp, "reshard", *sets, nproc=1)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [e for e in _events(tmp / "reshard") if e["event"] == "resumed"][-1]
    assert (resumed["step"], resumed["saved_world_size"], resumed["world_size"]) == (10, 2, 1)
    losses = _losses(tmp / "reshard")
    # Same global batches, one rank accumulating instead of two all-reducing: float-order close.
    assert [losses[s] for s in range(11, 21)] == pytest.approx(
        [reference[s] for s in range(11, 21)], rel=1e-3
    )


def test_simulated_oom_on_one_rank_recovers_with_the_same_update(
    tmp: Path, reference: dict[int, float]
) -> None:
    proc = _train(tmp, "oom", env={"HPCPIPE_CHAOS_OOM": "step=5,rank=1,micro=0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    recovered = [e for e in _events(tmp / "oom") if e["event"] == "oom_recovered"]
    assert len(recovered) == 1
    assert (recovered[0]["old_micro_batch_size"], recovered[0]["new_micro_batch_size"]) == (4, 2)
    assert (recovered[0]["new_accum_steps"], recovered[0]["rank"]) == (2, 1)
    losses = _losses(tmp / "oom")
    assert [losses[s] for s in range(1, 21)] == pytest.approx([reference[s] for s in range(1, 21)], rel=1e-4)


def test_a_stalled_rank_dumps_stacks_and_exits_non_zero(tmp: Path) -> None:
    env = {"HPCPIPE_CHAOS_HANG": "step=4,rank=1"}
    proc = _train(tmp, "hang", "--set", "fault.hang_timeout_s=4", env=env)
    assert proc.returncode != 0
    stacks = (tmp / "hang" / "hang-rank1.txt").read_text()
    assert "rank 1" in stacks and "_chaos_hang_forever" in stacks
    # Rank 0 waits for rank 1 in a collective, so its watchdog may fire too; rank 1's must.
    hangs = [e for e in _events(tmp / "hang") if e["event"] == "hang" and e["rank"] == 1]
    assert hangs and hangs[0]["step"] == 3
    assert f"exiting with code {HANG_EXIT_CODE}" in proc.stderr
