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


def _previous_check(work: Path) -> Path:
    """A work directory a check left, with the finished run it trained."""
    assert check_recipe(TINY, work=work, only=ONLY).passed
    run = work / "runs" / "ddp" / "metrics.jsonl"
    run.parent.mkdir(parents=True)
    run.write_text("{}\n")
    with (work / RECORD).open("a") as record:
        record.write("runs\n")
    return run


@pytest.mark.parametrize(
    ("config", "sets", "said"),
    [(None, ["train.lr=fast"], "train.lr"), ("missing.yaml", [], "config file not found: missing.yaml")],
)
def test_a_bad_job_is_refused_before_the_previous_checks_runs_are_removed(
    tmp_path: Path, config: str | None, sets: list[str], said: str
) -> None:
    """The previous check's runs were gone, and then the config was refused."""
    run = _previous_check(tmp_path / "work")
    with pytest.raises(UserError, match=re.escape(said)):
        check_recipe(TINY, config, sets, work=tmp_path / "work", only=ONLY)
    assert run.is_file()


def test_a_config_inside_the_work_directory_is_refused_and_kept(tmp_path: Path) -> None:
    """--config W/job.yaml (the previous check's) was removed with it, then not found."""
    work = tmp_path / "work"
    run = _previous_check(work)
    config = work / "job.yaml"
    with pytest.raises(UserError, match=rf"^--config {re.escape(str(config))}: lies in --work") as err:
        check_recipe(TINY, str(config), work=work, only=ONLY)
    assert "\n" not in str(err.value) and config.is_file() and run.is_file()
