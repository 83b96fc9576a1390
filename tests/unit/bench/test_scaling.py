"""A scaling study that fails at one world size keeps the ones it measured before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcpipe.bench import scaling
from hpcpipe.config import load_config


def test_a_failed_world_size_leaves_the_measured_ones_in_the_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_job(job: Any) -> Path:
        if job.parallel.nproc == 2:
            raise RuntimeError("worker rank 1 failed: CUDA out of memory")
        return tmp_path / job.run.name

    row = {"step_time_s": 0.5, "data_time_s": 0.0, "unit": "tokens"}
    monkeypatch.setattr("hpcpipe.launch.job.run_job", run_job)
    monkeypatch.setattr(scaling, "scaling_row", lambda run_dir, warmup: dict(row))
    with pytest.raises(RuntimeError, match="out of memory"):
        scaling.run_scaling(load_config("tiny"), [1, 2], ["strong"], 4, 1, tmp_path, bottlenecks=False)
    lines = (tmp_path / "scaling.csv").read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("strong,1,")  # the header and N=1: all was lost
