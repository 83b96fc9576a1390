"""The train and report steps of `hpcpipe run` on a real one-process run: what a changed key
does to a run that has trained to its last step, and what the report step checks on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli


def test_a_training_key_changed_after_the_last_step_is_refused_and_a_deleted_report_file_rewritten(
    tmp_path: Path,
) -> None:
    """train.lr changed after the last step: the step resumed, trained nothing, and recorded the
    new lr for a model trained with the old; report.md alone was checked on disk."""
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "train.steps=4", "--set", "checkpoint.every_steps=2"]
    assert run_cli("run", "tiny", *sets, cwd=tmp_path).returncode == 0
    lineage = tmp_path / "tiny" / "lineage.json"
    before = lineage.read_text()
    proc = run_cli("run", "tiny", *sets, "--set", "train.lr=0.01", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "already trained to step 4 with other settings (train.lr 0.003 -> 0.01)" in proc.stderr
    assert lineage.read_text() == before  # nothing recorded, nothing claimed
    (tmp_path / "tiny" / "summary.md").unlink()
    again = run_cli("run", "tiny", *sets, cwd=tmp_path)
    assert again.returncode == 0 and "run  report: outputs changed or missing on disk" in again.stdout
    assert (tmp_path / "tiny" / "summary.md").is_file()
    assert json.loads(lineage.read_text())["steps"]["train"]["inputs"]["config"]["train"]["lr"] == 0.003
    # A record of an older hpcpipe, which hashed the launcher's timeouts in: the train step runs
    # again (its inputs changed), resumes, trains nothing, and is not refused for them.
    record = json.loads(lineage.read_text())
    record["steps"]["train"]["inputs"]["config"]["parallel"]["timeout_s"] = 600.0
    record["steps"]["train"]["fingerprint"] = "older"
    lineage.write_text(json.dumps(record))
    older = run_cli("run", "tiny", *sets, cwd=tmp_path)
    assert older.returncode == 0 and "run  train: inputs changed" in older.stdout, older.stderr


def test_a_changed_dataset_after_the_last_step_is_refused(tmp_path: Path) -> None:
    """A source file changed after the last step: prepare made a new dataset, train resumed at
    its last step and trained nothing, and was recorded as trained on the new dataset (evaluate
    and export then skipped as unchanged, describing the model of the old data)."""
    sources = tmp_path / "src"
    sources.mkdir()
    for i in range(3):
        (sources / f"m{i}.py").write_text(
            "".join(f"def f{i}_{j}(x):\n    return x * {j}\n" for j in range(200))
        )
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", f"data.sources=[{sources}]"]
    sets += ["--set", "train.steps=4", "--set", "checkpoint.every_steps=2"]
    assert run_cli("run", "tiny", *sets, cwd=tmp_path).returncode == 0
    lineage = tmp_path / "tiny" / "lineage.json"
    trained = json.loads(lineage.read_text())["steps"]["train"]
    with (sources / "m0.py").open("a") as f:
        f.write("x = 1\n")
    proc = run_cli("run", "tiny", *sets, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "already trained to step 4 with other settings (a new dataset from prepare)" in proc.stderr
    assert "give a new run.name" in proc.stderr
    assert json.loads(lineage.read_text())["steps"]["train"] == trained


def test_the_register_step_reads_where_a_version_goes_not_the_sinks_transport(tmp_path: Path) -> None:
    """observe.mlflow.close_timeout_s or queue_size changed: a new registry version, aliases moved."""
    from hpcpipe.config import load_config
    from hpcpipe.pipeline.engine import fingerprint, step_inputs
    from hpcpipe.pipeline.steps import STEPS

    register = next(step for step in STEPS if step.name == "register")

    def fp(*sets: str) -> str:
        job = load_config("tiny", [f"run.out_dir={tmp_path}", *sets])
        return fingerprint(step_inputs(register, job.to_dict(), {}))

    on = fp("observe.mlflow.tracking_uri=http://h:5000")
    assert fp("observe.mlflow.tracking_uri=http://h:5000", "observe.mlflow.close_timeout_s=60") == on
    assert fp("observe.mlflow.tracking_uri=http://h:5000", "observe.mlflow.queue_size=500") == on
    assert fp("observe.mlflow.tracking_uri=http://other:5000") != on
    assert fp("observe.mlflow.tracking_uri=http://h:5000", "observe.mlflow.experiment=e") != on
    assert fp("observe.mlflow.experiment=hpcpipe") != fp()  # turned on, the URI from the environment


def test_the_final_checkpoint_is_the_one_a_resume_loads_from_either_tier(tmp_path: Path) -> None:
    """Only the fast tier was read: with it lost, export found no checkpoint and the train step's
    outputs none, though a resume loads the durable tier's; a step both hold is the fast tier's."""
    from hpcpipe.config import load_config
    from hpcpipe.pipeline.engine import StepContext
    from hpcpipe.pipeline.steps import newest_checkpoint

    fast, durable = tmp_path / "fast", tmp_path / "durable"
    sets = [f"run.out_dir={tmp_path}", f"checkpoint.dir={fast}", f"checkpoint.durable_dir={durable}"]
    job = load_config("tiny", sets)
    ctx = StepContext(job, job.run_dir)
    assert newest_checkpoint(ctx) is None
    (durable / "step-00000006").mkdir(parents=True)
    (fast / "step-00000004").mkdir(parents=True)
    assert newest_checkpoint(ctx) == durable / "step-00000006"
    (fast / "step-00000006").mkdir()
    assert newest_checkpoint(ctx) == fast / "step-00000006"


def test_the_evaluate_step_copies_the_metrics_not_the_rows_time(tmp_path: Path) -> None:
    """Evaluation rows now carry their ``time``: eval.json, and the registered version's eval.*
    tags made from it, would have held it as a metric."""
    from hpcpipe.config import load_config
    from hpcpipe.pipeline.engine import StepContext
    from hpcpipe.pipeline.steps import evaluate

    job = load_config("tiny", [f"run.out_dir={tmp_path}"])
    job.run_dir.mkdir(parents=True)
    row = {"step": 4, "val_loss": 2.5, "val_ppl": 12.2, "time": 1.7e9}
    (job.run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    evaluate(StepContext(job, job.run_dir, say=lambda _: None))
    written = json.loads((job.run_dir / "eval.json").read_text())
    assert written["step"] == 4 and written["metrics"] == {"val_loss": 2.5, "val_ppl": 12.2}


def test_the_register_step_registers_the_run_on_the_configured_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's first server was another (`track sync --tracking-uri` ran first): the step
    looked up that server's run id on the configured server, where MLflow has no such run."""
    from tests.unit.track.test_registry import FakeClient, _export

    from hpcpipe.config import load_config
    from hpcpipe.pipeline.engine import StepContext
    from hpcpipe.pipeline.steps import register
    from hpcpipe.track import mlflow_client, sync
    from hpcpipe.track.mlflow_client import record_run

    sets = [f"run.out_dir={tmp_path}", "pipeline.register_as=m", "observe.mlflow.tracking_uri=http://a:5000"]
    job = load_config("tiny", sets)
    (job.run_dir / "export").mkdir(parents=True)
    record_run(job.run_dir, "http://b:5000", "on-b", "1")
    record_run(job.run_dir, "http://a:5000", "on-a", "1")
    _export(job.run_dir, 4)
    client = FakeClient()
    monkeypatch.setattr(sync, "sync_run", lambda run_dir: None)
    monkeypatch.setattr(mlflow_client, "make_client", lambda uri: client)
    register(StepContext(job, job.run_dir, say=lambda _: None))
    assert client.versions[-1].run_id == "on-a"
