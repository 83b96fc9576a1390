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


@pytest.mark.parametrize(("strategy", "twins"), [("ddp", ["n2"]), ("deepspeed", [])])
def test_no_sync_twins_only_where_the_strategy_can_skip_gradient_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, twins: list[str]
) -> None:
    """DeepSpeed refuses parallel.sync_gradients=false: its twin failed with exit 2 after the
    N=1 and N=2 runs had trained; now it trains none and says why."""
    trained: list[Any] = []

    def run_job(job: Any) -> Path:
        trained.append(job)
        return tmp_path / job.run.name

    row = {"step_time_s": 0.5, "data_time_s": 0.0, "unit": "tokens"}
    monkeypatch.setattr("hpcpipe.launch.job.run_job", run_job)
    monkeypatch.setattr(scaling, "scaling_row", lambda run_dir, warmup: dict(row))
    monkeypatch.setattr(scaling, "summarize_run", lambda run_dir, warmup: {"step_time_s": 0.4})
    cfg = load_config("tiny", [f"parallel.strategy={strategy}"])
    result = scaling.run_scaling(cfg, [1, 2], ["strong"], 4, 1, tmp_path)
    nosync = [job.run.name.split("-")[-2] for job in trained if not job.parallel.sync_gradients]
    assert nosync == twins and len(trained) == 2 + len(twins)
    assert [r["step_time_nosync_s"] for r in result["rows"]] == [None, 0.4 if twins else None]
    assert bool(result["notes"]) is (strategy == "deepspeed")
    assert all("parallel.strategy=deepspeed" in note for note in result["notes"])
