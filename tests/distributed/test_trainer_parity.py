"""The trainer across strategies: single vs DDP vs FSDP2 on 2 gloo ranks, determinism, golden curve.

Tolerance: single-process and 2-rank runs see the same global batches in the same order; they
differ only in floating-point summation order (gradient all-reduce vs local accumulation), so
per-step losses agree to a relative 1e-3 over 20 steps of the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.observe.metrics import read_metrics

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tiny_single_loss.json"
PARITY_RTOL = 1e-3


def train_tiny(tmp: Path, name: str, nproc: int, *sets: str) -> list[float]:
    """Train the tiny preset on the synthetic corpus; the logged loss of every step."""
    sets = tiny_job_sets(tmp, name, *sets)
    proc = run_cli("train", "tiny", "--nproc", str(nproc), *sets, cwd=tmp, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(tmp / name)
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 20
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    tmp = tmp_path_factory.mktemp("parity")
    return {
        "single": train_tiny(tmp, "single", 1),
        "ddp": train_tiny(tmp, "ddp", 2, "parallel.strategy=ddp"),
        "fsdp": train_tiny(tmp, "fsdp", 2, "parallel.strategy=fsdp"),
    }


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_single_and_ddp_follow_the_same_curve(runs: dict[str, list[float]]) -> None:
    assert runs["single"] == pytest.approx(runs["ddp"], rel=PARITY_RTOL)
    assert runs["ddp"][-1] < runs["ddp"][0] - 0.5  # it learns


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_fsdp_matches_ddp(runs: dict[str, list[float]]) -> None:
    assert runs["fsdp"] == pytest.approx(runs["ddp"], rel=PARITY_RTOL)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_golden_loss_curve(runs: dict[str, list[float]]) -> None:
    """The tiny model's single-process curve; regenerate with tests/golden/regenerate.py."""
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert runs["single"] == pytest.approx(golden, rel=1e-4)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_external_torchrun_starts_the_same_job(tmp_path: Path, runs: dict[str, list[float]]) -> None:
    """`torchrun -m hpcpipe train` (the workers detect torchrun) gives the DDP curve bit for bit:
    a second run of the same job, seed and world size, so this is also the proof that such runs
    are bitwise identical (it had a third DDP run of its own, `ddp_again`, for that)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    sets = tiny_job_sets(tmp_path, "ext", "parallel.strategy=ddp")
    cmd = [*torchrun, "-m", "hpcpipe", "train", "tiny", *sets]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(tmp_path / "ext") if "loss" in r]
    assert losses == runs["ddp"]
