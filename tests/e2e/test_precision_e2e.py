"""Mixed precision on CPU, end to end: bf16 autocast and fp16 autocast with a gradient scaler both
train the tiny preset through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import run_cli, tiny_job_sets

from hpcpipe.observe.metrics import read_metrics


@pytest.mark.timeout(120)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path: Path, precision: str) -> None:
    sets = tiny_job_sets(tmp_path, precision, f"train.precision={precision}", "train.steps=12")
    proc = run_cli("train", "tiny", "--nproc", "1", *sets, cwd=tmp_path, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path / precision)
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 12
    assert losses[-1] < losses[0] - 0.3
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert vals[-1] < vals[0]
