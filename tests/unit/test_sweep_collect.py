"""``hpcpipe launch collect`` (``sweep.collect_plan``): array tasks that end together must not lose
each other's rows, so each collector holds the plan locked from reading the points to writing
``sweep.csv`` (a lost update left a finished point "pending" on Slurm once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcpipe import sweep
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout, SweepLayout
from hpcpipe.sweep import collect_plan, plan_points, write_plan

# Another process (POSIX locks are per process) tries the plan's lock without waiting: exit 0 when
# it got it, 1 when a collector holds it.
TRY_LOCK = """
import fcntl, sys
with open(sys.argv[1], "r+") as f:
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(1)
"""


def _free_elsewhere(path: Path) -> bool:
    code = subprocess.run([sys.executable, "-c", TRY_LOCK, str(path)], timeout=60, check=False).returncode
    assert code in (0, 1)
    return code == 0


def test_a_collector_holds_the_plan_locked_from_its_read_to_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = plan_points("tiny", [], {"train.lr": [0.1, 0.2]}, tmp_path)
    for point in points:  # what `launch slurm --grid` writes for each array task
        point.run_dir.mkdir(parents=True)
        RunLayout(point.run_dir).config.write_text(point.job.to_yaml())
    write_plan(points, tmp_path)
    plan = SweepLayout(tmp_path).plan
    free_while_writing: list[bool] = []
    write = sweep.write_sweep_csv

    def watched(rows: list[dict[str, Any]], path: Path) -> Path:
        free_while_writing.append(_free_elsewhere(plan))
        return write(rows, path)

    monkeypatch.setattr(sweep, "write_sweep_csv", watched)
    collect_plan(tmp_path)
    assert free_while_writing == [False]  # another task's collector waits for this one
    assert _free_elsewhere(plan)  # and gets it after
    rows = SweepLayout(tmp_path).csv.read_text().splitlines()
    assert len(rows) == 3 and all(",pending," in r for r in rows[1:])


def test_a_missing_plan_is_one_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"sweep_plan\.json: cannot read the sweep plan"):
        collect_plan(tmp_path)
