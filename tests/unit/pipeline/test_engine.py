"""The pipeline engine on stand-in steps that write files: skip when unchanged, re-run what a
changed key feeds, resume at a failed step, --from / --only, steps with nothing to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import UserError
from hpcpipe.pipeline.engine import NotApplicable, Step, StepContext, file_sha256, run_pipeline


def _steps(log: list[str], fail: set[str]) -> list[Step]:
    def writer(name: str, content: str):  # type: ignore[no-untyped-def]
        def run(ctx: StepContext) -> None:
            log.append(name)
            if name in fail:
                raise RuntimeError(f"{name} broke")
            (ctx.run_dir / f"{name}.txt").write_text(content + str(ctx.job.train.steps))

        return run

    def outputs(name: str):  # type: ignore[no-untyped-def]
        return lambda ctx: {name: file_sha256(ctx.run_dir / f"{name}.txt") or "missing"}

    def nothing(ctx: StepContext) -> None:
        log.append("register")
        raise NotApplicable("pipeline.register_as is null")

    return [
        Step("prepare", ("data",), (), writer("prepare", "data"), outputs("prepare"), ""),
        Step("train", ("train",), ("prepare",), writer("train", "weights"), outputs("train"), ""),
        Step(
            "export", ("pipeline.export_format",), ("train",), writer("export", "hf"), outputs("export"), ""
        ),
        Step("register", ("pipeline.register_as",), ("export",), nothing, lambda ctx: {}, ""),
    ]


def _job(tmp_path: Path, *sets: str) -> JobConfig:
    return load_config("tiny", [f"run.out_dir={tmp_path}", *sets])


def _run(
    tmp_path: Path, job: JobConfig, fail: set[str] | None = None, **kw: str
) -> tuple[list[str], list[str]]:
    log: list[str] = []
    said: list[str] = []
    run_pipeline(_steps(log, fail or set()), StepContext(job, job.run_dir, say=said.append), **kw)
    return log, said


def test_a_second_run_skips_every_step_and_says_so(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert _run(tmp_path, job)[0] == ["prepare", "train", "export", "register"]
    ran, said = _run(tmp_path, job)
    assert ran == []
    assert said == [f"skip {name}: unchanged" for name in ("prepare", "train", "export", "register")]
    steps = json.loads((job.run_dir / "lineage.json").read_text())["steps"]
    assert steps["register"]["status"] == "not-applicable"
    assert steps["train"]["inputs"]["upstream"]["prepare"] == {
        "prepare": file_sha256(job.run_dir / "prepare.txt")
    }


def test_a_changed_key_reruns_only_the_steps_downstream_of_it(tmp_path: Path) -> None:
    _run(tmp_path, _job(tmp_path))
    ran, said = _run(tmp_path, _job(tmp_path, "pipeline.export_format=safetensors"))
    # The stand-in export writes the same bytes in any format: register's input is unchanged.
    assert ran == ["export"]
    assert "run  export: inputs changed: config pipeline.export_format" in said
    ran, _ = _run(tmp_path, _job(tmp_path, "pipeline.export_format=safetensors", "train.steps=30"))
    assert ran == ["train", "export", "register"]


def test_register_reruns_when_export_output_changes(tmp_path: Path) -> None:
    _run(tmp_path, _job(tmp_path))
    ran, said = _run(tmp_path, _job(tmp_path, "train.steps=30"))
    assert ran == ["train", "export", "register"]
    assert "run  register: inputs changed: export outputs" in said


def test_a_failed_step_is_resumed_not_redone(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with pytest.raises(RuntimeError, match="export broke"):
        _run(tmp_path, job, fail={"export"})
    steps = json.loads((job.run_dir / "lineage.json").read_text())["steps"]
    assert steps["export"]["status"] == "failed" and "export broke" in steps["export"]["error"]
    assert "register" not in steps
    ran, said = _run(tmp_path, job)
    assert ran == ["export", "register"]
    assert "run  export: failed last time: resuming" in said


def test_outputs_deleted_on_disk_rerun_the_step(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _run(tmp_path, job)
    (job.run_dir / "export.txt").unlink()
    ran, said = _run(tmp_path, job)
    assert ran == ["export"]  # rewritten with the same content: register's input is unchanged
    assert "run  export: outputs changed or missing on disk" in said


def test_from_and_only(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with pytest.raises(UserError, match="--only export: run train first"):
        _run(tmp_path, job, only="export")
    _run(tmp_path, job)
    assert _run(tmp_path, job, start="export")[0] == ["export", "register"]
    assert _run(tmp_path, job, only="train")[0] == ["train"]
    with pytest.raises(UserError, match="--from deploy: no such step"):
        _run(tmp_path, job, start="deploy")
    with pytest.raises(UserError, match="--from and --only: give one"):  # --from was ignored
        _run(tmp_path, job, start="report", only="train")


def test_a_key_a_step_ignores_and_a_refusal_change_nothing(tmp_path: Path) -> None:
    """parallel.timeout_s retrained the whole run; a step's UserError recorded it as failed (and
    the next run 'resumed' it)."""
    from dataclasses import replace

    log: list[str] = []
    steps = [
        replace(step, reads=("train", "parallel"), ignores=("parallel.timeout_s",))
        for step in _steps(log, set())[:2]
    ]
    job = _job(tmp_path)
    run_pipeline(steps, StepContext(job, job.run_dir, say=lambda _: None))
    assert log == ["prepare", "train"]
    log.clear()
    slower = _job(tmp_path, "parallel.timeout_s=999")
    run_pipeline(steps, StepContext(slower, slower.run_dir, say=lambda _: None))
    assert log == []
    before = (job.run_dir / "lineage.json").read_text()

    def refuse(ctx: StepContext) -> None:
        raise UserError("train: refused")

    refusing = [steps[0], replace(steps[1], run=refuse)]
    with pytest.raises(UserError, match="refused"):
        run_pipeline(refusing, StepContext(job, job.run_dir, say=lambda _: None), start="train")
    assert (job.run_dir / "lineage.json").read_text() == before


def test_a_restart_of_the_workers_keeps_the_step_records(tmp_path: Path) -> None:
    from hpcpipe.observe.lineage import read_lineage, write_lineage

    job = _job(tmp_path)
    _run(tmp_path, job)
    write_lineage(job.run_dir, {"git_sha": "abc", "world_size": 2})  # what a worker writes at start
    lineage = read_lineage(job.run_dir)
    assert lineage["git_sha"] == "abc" and set(lineage["steps"]) == {"prepare", "train", "export", "register"}


def test_under_torchrun_every_rank_trains_and_only_rank_0_goes_on_and_records(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _run(tmp_path, job)
    lineage_before = (job.run_dir / "lineage.json").read_text()
    log: list[str] = []
    other = StepContext(job, job.run_dir, group_steps=("prepare", "train"), is_main=False)
    run_pipeline(_steps(log, set()), other)
    assert log == ["prepare", "train"]  # never skipped on its own reading: rank 0 trains too
    assert (job.run_dir / "lineage.json").read_text() == lineage_before
    log.clear()
    main = StepContext(job, job.run_dir, group_steps=("prepare", "train"), say=lambda _: None)
    run_pipeline(_steps(log, set()), main)
    assert log == ["prepare", "train"]  # the rest are unchanged: skipped


def test_an_export_s_lock_file_is_not_part_of_its_outputs(tmp_path: Path) -> None:
    """A register creates .hpcpipe-export.lock in an export written before locks were files: the
    export step would have run again, its outputs changed."""
    from hpcpipe.pipeline.engine import tree_sha256

    (tmp_path / "model.safetensors").write_text("w")
    before = tree_sha256(tmp_path)
    (tmp_path / ".hpcpipe-export.lock").touch()
    assert tree_sha256(tmp_path) == before
