"""Bad input to the tracking, lineage and pipeline verbs: one line, exit 2, no password shown;
the TensorBoard sink's files read back with tensorboard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.netutil import free_port


def _one_error_line(proc_stderr: str) -> str:
    lines = [line for line in proc_stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc_stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("register", "{tmp}", "--name", "m"), "not a run directory (no config.yaml)"),
        (("track", "sync", "{tmp}"), "not a run directory (no config.yaml)"),
        (("lineage", "{tmp}"), "no lineage.json"),
        (("track", "sync", "{tmp}/bare"), "no run.recipe and run.name"),  # KeyError 'recipe' before
        (("track", "sync", "{tmp}/no-section"), "observe.mlflow is not a section"),
        (("run", "tiny", "--from", "deploy", "--set", "run.out_dir={tmp}"), "--from deploy: no such step"),
        (
            ("train", "tiny", "--set", "observe.mlflow.tracking_uri=http://al:pw7@h:5000"),
            "MLFLOW_TRACKING_PASSWORD",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    for name, config in (
        ("bare", "run: {name: x}\n"),
        ("no-section", "run: {name: x, recipe: gpt}\nobserve: 3\n"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(config)
    proc = run_cli(*(a.replace("{tmp}", str(tmp_path)) for a in args), cwd=tmp_path)
    assert proc.returncode == 2
    line = _one_error_line(proc.stderr)
    assert says in line and "pw7" not in line


@pytest.mark.parametrize(
    ("verb", "damaged", "says"),
    [
        ("lineage", "lineage.json", "lineage.json: not valid JSON (Expecting property name"),
        ("report", "lineage.json", "lineage.json: not valid JSON (Expecting property name"),
        ("report", "config.yaml", "config.yaml (line 2): not valid YAML"),
        ("track sync", "config.yaml", "config.yaml (line 2): not valid YAML"),
    ],
)
def test_a_damaged_run_file_is_named(tmp_path: Path, verb: str, damaged: str, says: str) -> None:
    """The error said "no lineage.json", or gave json's "line 1 column 2" without the file."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run:\n  name: run\n")
    (run / "lineage.json").write_text("{}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (run / damaged).write_text("{bad\n" if damaged.endswith(".json") else "a: [\n")
    proc = run_cli(*verb.split(), str(run), cwd=tmp_path)
    assert proc.returncode == 2
    assert says in _one_error_line(proc.stderr)


def test_an_unreachable_registry_is_one_line_without_the_password(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    port = free_port()
    uri = f"http://alice:pw7@127.0.0.1:{port}"
    proc = run_cli(
        "models", "list", "--tracking-uri", uri, cwd=tmp_path, env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    )
    assert proc.returncode == 2
    line = _one_error_line(proc.stderr)
    assert f"127.0.0.1:{port}" in line and "pw7" not in line and "alice" not in line


def test_a_fresh_tensorboard_run_in_the_same_directory_replaces_the_earlier_curves(tmp_path: Path) -> None:
    """A second fresh start (step 0) purged nothing: TensorBoard drew both runs' losses as one."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpcpipe.config import load_config
    from hpcpipe.track.tensorboard import TensorBoardSink

    config = load_config("tiny").to_dict()
    for base in (10.0, 100.0):
        sink = TensorBoardSink(tmp_path, config, start_step=0)
        for step in range(1, 4):
            sink.on_row({"step": step, "loss": base - step})
        sink.close(finished=True)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 99.0), (2, 98.0), (3, 97.0)]


def test_tensorboard_files_hold_rows_events_and_hparams_and_a_resume_purges(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpcpipe.config import load_config
    from hpcpipe.track.tensorboard import TensorBoardSink

    config = load_config("tiny").to_dict()
    sink = TensorBoardSink(tmp_path, config, start_step=0)
    for step in range(1, 11):
        sink.on_row({"step": step, "loss": 10.0 - step, "lr": 0.1, "world_size": 2})
    sink.on_row({"step": 10, "val_loss": 3.5})
    sink.on_event("checkpoint_saved", {"step": 10, "path": "x"})
    sink.close(finished=False)
    # A restart resumed from step 5: what was logged after it is replaced.
    sink = TensorBoardSink(tmp_path, config, start_step=5)
    for step in range(6, 9):
        sink.on_row({"step": step, "loss": 1.0})
    sink.close(finished=True)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    loss = {e.step: e.value for e in events.Scalars("train/loss")}
    assert sorted(loss) == list(range(1, 9)) and loss[5] == 5.0 and loss[6] == 1.0
    assert "train/world_size" not in events.Tags()["scalars"]
    assert "_hparams_/experiment" in events.PluginTagToContent("hparams")
    assert {"config/text_summary", "events/text_summary"} <= set(events.Tags()["tensors"])


def test_lineage_names_the_steps_not_yet_run(tmp_path: Path) -> None:
    import json

    record = {
        "git_sha": "abc",
        "config_hash": "f" * 64,
        "steps": {"prepare": {"status": "done", "outputs": {"dataset": "d" * 64}}},
    }
    (tmp_path / "lineage.json").write_text(json.dumps(record))
    proc = run_cli("lineage", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "made: dataset dddddddddddd" in proc.stdout
    assert "train: not run (the workers; resumes from the newest verified checkpoint)" in proc.stdout
