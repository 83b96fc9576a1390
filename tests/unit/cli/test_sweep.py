"""``hpcpipe sweep`` forks its workers' server from itself before any point trains
(``cli/sweep.py``): counted by the most ranks a pending point has, and not when every point is done.
Where the sweep goes without --out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcpipe import sweep as sweep_module
from hpcpipe.cli.sweep import sweep
from hpcpipe.launch import job as job_module


@pytest.fixture
def prestarts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    seen: list[tuple[str, int | None]] = []

    def record(job: Any, max_restarts: int = 0, nproc: int | None = None) -> None:
        seen.append((job.run.name, nproc))

    monkeypatch.setattr(job_module, "prestart_fork_server", record)
    monkeypatch.setattr(sweep_module, "run_sweep", lambda *a, **k: {"rows": [], "csv": "-", "failed": 0})
    return seen


def test_the_server_is_forked_for_the_largest_pending_point(
    prestarts: list[tuple[str, int | None]], tmp_path: Path
) -> None:
    sweep("tiny", grids=["parallel.nproc=[1,2]"], out=tmp_path, json_out="-")
    assert prestarts == [("tiny-nproc_1", 2)]  # the first point's job, the second point's ranks


def test_no_server_when_every_point_is_done(
    prestarts: list[tuple[str, int | None]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_module, "is_done", lambda point: True)
    sweep("tiny", grids=["parallel.nproc=[1,2]"], out=tmp_path, json_out="-")
    assert prestarts == []


@pytest.mark.parametrize("stop", ["worker", "in-process"])
def test_a_stopped_point_ends_the_sweep_with_its_code(
    prestarts: list[tuple[str, int | None]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    import typer

    from hpcpipe.launch.job import WorkerFailure
    from hpcpipe.train.preempt import Preempted

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise WorkerFailure(75) if stop == "worker" else Preempted(3, 75)

    monkeypatch.setattr(sweep_module, "run_sweep", stopped)
    with pytest.raises(typer.Exit) as exited:
        sweep("tiny", grids=["parallel.nproc=[1,2]"], out=tmp_path, json_out="-")
    assert exited.value.exit_code == 75


def test_the_sweep_goes_under_the_job_s_out_dir_unless_out_is_given(
    prestarts: list[tuple[str, int | None]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.out_dir was ignored: the sweep went to ./runs/sweep-<name> and its points with it."""
    dirs: list[Path] = []
    monkeypatch.setattr(
        sweep_module, "run_sweep", lambda points, out, *a, **k: dirs.append(out) or {"failed": 0}
    )
    sets = [f"run.out_dir={tmp_path / 'scratch'}"]
    sweep("tiny", grids=["train.lr=[0.1,0.2]"], sets=sets, json_out="-")
    sweep("tiny", grids=["train.lr=[0.1,0.2]"], sets=sets, out=tmp_path / "given", json_out="-")
    assert dirs == [tmp_path / "scratch" / "sweep-tiny", tmp_path / "given"]
