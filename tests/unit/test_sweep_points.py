"""Sweep points: their own checkpoint directories, a grid value once, null as null, and a run of
another config never taken for the point's."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcpipe.config import JobConfig
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.sweep import plan_points, run_sweep


def test_a_checkpoint_dir_outside_the_runs_is_each_points_own(tmp_path: Path) -> None:
    """One shared directory: every point resumed the one before it and trained 0 steps."""
    sets = [f"checkpoint.dir={tmp_path}/ck", f"checkpoint.durable_dir={tmp_path}/durable"]
    points = plan_points("tiny", sets, {"train.lr": [0.003, 0.0003]}, tmp_path / "out")
    dirs = [(Path(p.job.checkpoint.dir or ""), Path(p.job.checkpoint.durable_dir or "")) for p in points]
    assert len({d for pair in dirs for d in pair}) == 4  # each point's own, in each tier
    assert all(
        ck.parent.parent == tmp_path / "ck" and ck.name == p.run_dir.name
        for (ck, _), p in zip(dirs, points, strict=True)
    )
    # Another sweep (another --out) of the same points: other directories, not these to resume.
    elsewhere = plan_points("tiny", sets, {"train.lr": [0.003, 0.0003]}, tmp_path / "other")
    assert {p.job.checkpoint.dir for p in elsewhere}.isdisjoint({p.job.checkpoint.dir for p in points})


def test_a_grid_value_naming_a_secret_env_is_refused_before_any_point(tmp_path: Path) -> None:
    """Only the base job was checked: the value went into the point's folder name, its
    config.yaml and sweep.csv."""
    grid = {"launch.k8s.env": [{"HF_TOKEN": "hf_abc123"}]}
    with pytest.raises(UserError, match=r"^sweep point launch.k8s.env: .*HF_TOKEN looks like a secret") as e:
        plan_points("tiny", [], grid, tmp_path / "out")
    assert "hf_abc123" not in str(e.value)  # the message goes to logs: never the value
    assert not (tmp_path / "out").exists()


def test_a_repeated_value_and_a_null_value(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is one point twice"):
        plan_points("tiny", [], {"train.lr": [0.003, 0.0030]}, tmp_path)
    (point,) = plan_points("tiny", [], {"checkpoint.dir": [None]}, tmp_path)  # it was "None": ./None
    assert point.job.checkpoint.dir is None and point.overrides == ("checkpoint.dir=null",)


def test_a_run_of_another_config_is_moved_aside_and_the_point_trains_anew(tmp_path: Path) -> None:
    """Run again with another base config, the point resumed the old run's final checkpoint,
    trained nothing and reported its results under the new config."""
    trained: list[str] = []

    def train(job: JobConfig) -> Path:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        assert not (job.run_dir / "old-checkpoint").exists()
        RunLayout(job.run_dir).config.write_text(job.to_yaml())
        trained.append(job.run_dir.name)
        return job.run_dir

    out = tmp_path / "out"
    said: list[str] = []
    first = plan_points("tiny", ["train.lr=0.003"], {"train.micro_batch_size": [4]}, out)
    run_sweep(first, out, train, said.append)
    (first[0].run_dir / "old-checkpoint").mkdir()
    (RunLayout(first[0].run_dir).sweep_point).unlink()  # as if interrupted: same config resumes
    run_sweep(first, out, lambda job: trained.append("resumed") or job.run_dir, said.append)
    assert trained[-1] == "resumed" and (first[0].run_dir / "old-checkpoint").is_dir()
    again = plan_points("tiny", ["train.lr=0.0003"], {"train.micro_batch_size": [4]}, out)
    (RunLayout(first[0].run_dir).sweep_point).unlink()
    run_sweep(again, out, train, said.append)
    aside = out / f"{first[0].run_dir.name}.earlier-1"
    assert (aside / "old-checkpoint").is_dir() and any("holds another config" in line for line in said)


def test_a_run_whose_recipe_module_raises_on_import_is_moved_aside(tmp_path: Path) -> None:
    """A traceback ended the sweep: the old run's config, of another recipe, no longer loads."""
    from hpcpipe.sweep import _set_aside_other_config

    (point,) = plan_points("tiny", [], {"train.lr": [0.003]}, tmp_path)
    point.run_dir.mkdir(parents=True)
    other = point.job.to_yaml().replace("recipe: gpt", "recipe: tests.recipe_raises_on_import:A")
    RunLayout(point.run_dir).config.write_text(other)
    assert _set_aside_other_config(point) == point.run_dir.with_name(f"{point.run_dir.name}.earlier-1")


def test_its_own_checkpoint_directory_goes_aside_with_the_run(tmp_path: Path) -> None:
    """The run directory went aside, its checkpoint.dir stayed: the new config resumed it."""
    out, sets = tmp_path / "out", [f"checkpoint.dir={tmp_path}/ck"]

    def train(job: JobConfig) -> Path:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        RunLayout(job.run_dir).config.write_text(job.to_yaml())
        assert job.checkpoint.dir is not None and not Path(job.checkpoint.dir).exists()  # nothing to resume
        Path(job.checkpoint.dir, "step-00000004").mkdir(parents=True)
        return job.run_dir

    first = plan_points("tiny", [*sets, "train.lr=0.003"], {"train.micro_batch_size": [4]}, out)
    run_sweep(first, out, train, lambda line: None)
    again = plan_points("tiny", [*sets, "train.lr=0.0003"], {"train.micro_batch_size": [4]}, out)
    RunLayout(first[0].run_dir).sweep_point.unlink()
    run_sweep(again, out, train, lambda line: None)
    own = Path(first[0].job.checkpoint.dir or "")
    assert (own.parent / f"{own.name}.earlier-1" / "step-00000004").is_dir()


def test_grid_values_are_read_as_yaml_1_2() -> None:
    from hpcpipe.sweep import parse_grid_option

    assert parse_grid_option("train.steps=[010, 020]") == ("train.steps", [10, 20])  # it was [8, 16]
    assert parse_grid_option("train.lr=[0.001, 1e-3]") == ("train.lr", [0.001, 0.001])  # 1e-3 was a string


def test_an_exponent_and_a_decimal_of_one_value_are_one_point(tmp_path: Path) -> None:
    from hpcpipe.sweep import parse_grid_option

    with pytest.raises(UserError, match="is one point twice"):  # two runs trained the same lr
        plan_points("tiny", [], dict([parse_grid_option("train.lr=[0.001, 1e-3]")]), tmp_path)


@pytest.mark.parametrize(("code", "stops"), [(75, True), (130, True), (76, True), (1, False), (137, False)])
def test_a_preemption_or_ctrl_c_stops_the_sweep_with_its_code(tmp_path: Path, code: int, stops: bool) -> None:
    """A point's preemption (or Ctrl-C, or its study's prune) was recorded as a failure: the sweep
    trained every remaining point and exited 1, and the scheduler never resubmitted it."""
    from hpcpipe.launch.job import WorkerFailure

    trained: list[str] = []

    def train(job: JobConfig) -> Path:
        trained.append(job.run_dir.name)
        raise WorkerFailure(code)

    out = tmp_path / "out"
    points = plan_points("tiny", [], {"train.lr": [0.003, 0.0003]}, out)
    said: list[str] = []
    if stops:
        with pytest.raises(WorkerFailure) as raised:
            run_sweep(points, out, train, said.append)
        assert raised.value.exit_code == code and len(trained) == 1
        assert "run the sweep again" in said[-1]
    else:
        assert run_sweep(points, out, train, said.append)["failed"] == 2
