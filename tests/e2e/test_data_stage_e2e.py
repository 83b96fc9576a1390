"""A training run with data.cache_dir reads the staged, verified copy of its dataset."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli

from hpcpipe.data.stage import MARKER


def test_training_with_cache_dir_reads_the_staged_copy(tmp_path: Path) -> None:
    from tests.helpers import tiny_job_sets

    from hpcpipe.observe.metrics import read_metrics

    cache = tmp_path / "nvme"
    sets = tiny_job_sets(tmp_path, "staged", "train.steps=3", f"data.cache_dir={cache}")
    result = run_cli("train", "tiny", *sets)
    assert result.returncode == 0, result.stderr[-2000:]
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / MARKER).is_file()
    assert [r["step"] for r in read_metrics(tmp_path / "staged") if "loss" in r] == [1, 2, 3]
