"""`recipes check --work DIR` given again: the earlier check's runs were resumed, not retrained
(properties passed on stale results), and its kill marker held the kill back. A check now
empties a previous check's directory first and refuses one that holds anything else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcpipe.errors import UserError
from hpcpipe.recipecheck.runner import check_recipe
from hpcpipe.recipecheck.work import RECORD

TINY = "tests.recipes_for_tests:Tiny"
ONLY = ("bad-args-refused",)  # no run: what the check writes besides them is what is tested


def test_a_previous_checks_runs_are_removed_before_the_next_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    assert check_recipe(TINY, work=work, only=ONLY).passed
    assert "job.yaml" in (work / RECORD).read_text()
    # What a check that trained leaves: a finished run and the marker of the kill it fired.
    for stale in (work / "runs" / "ddp" / "metrics.jsonl", work / "kill-markers" / "step-4.fired"):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("{}\n")
    with (work / RECORD).open("a") as record:
        record.write("runs\nkill-markers\n")
    capsys.readouterr()
    assert check_recipe(TINY, work=work, only=ONLY).passed
    assert not (work / "runs").exists() and not (work / "kill-markers").exists()
    assert (work / "job.yaml").is_file()
    note = capsys.readouterr().err
    assert f"note: --work {work}: removed the previous check's" in note and "kill-markers" in note


@pytest.mark.parametrize("recorded", [False, True])
def test_a_work_directory_holding_anything_else_is_refused_and_left_alone(
    tmp_path: Path, recorded: bool
) -> None:
    """Without a record it is not a check's; with one, a file the record does not list is not."""
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "runs").mkdir()
    if recorded:
        (tmp_path / RECORD).write_text("runs\n")
    with pytest.raises(UserError, match=rf"^--work {re.escape(str(tmp_path))}: .*notes\.txt") as err:
        check_recipe(TINY, work=tmp_path, only=ONLY)
    assert "\n" not in str(err.value)
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and (tmp_path / "runs").is_dir()
