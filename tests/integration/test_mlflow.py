"""MLflow against a real tracking server (SQLite store, loopback): a 2-rank `hpcpipe run` logs
params, metrics, tags and artifacts and registers its export with lineage and an alias;
TensorBoard files read back; no password reaches any log or artifact; a server stopped mid-run
does not stop training, and `hpcpipe track sync` fills the gap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers import needs_package, run_cli, tiny_job_sets
from tests.integration.mlflow_server import MlflowServer
from tests.integration.tcp_gate import TcpGate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), needs_package("mlflow", "mlflow")]

SECRET = "s3cret-pw"
STEPS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    running = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    try:
        yield running
    finally:
        running.stop()


def _with_credentials(url: str) -> str:
    return url.replace("http://", f"http://alice:{SECRET}@")


def _run_id(run_dir: Path) -> str:
    return str(json.loads((run_dir / "tracking" / "mlflow.json").read_text())["run_id"])


def _files_holding(root: Path, text: str) -> list[Path]:
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_two_rank_run_is_tracked_and_registered(server: MlflowServer, tmp_path: Path) -> None:
    sets = tiny_job_sets(
        tmp_path, "tracked", "parallel.strategy=ddp", f"train.steps={STEPS}", "checkpoint.every_steps=10",
        "observe.tensorboard=true", "observe.mlflow.experiment=integration",
        "pipeline.register_as=tiny-gpt", "pipeline.aliases=[champion]",
    )  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": _with_credentials(server.url)}
    proc = run_cli("run", "tiny", "--nproc", "2", *sets, cwd=tmp_path, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "tracked"
    client = server.client()
    run = client.get_run(_run_id(run_dir))
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == str(STEPS) and run.data.params["parallel.strategy"] == "ddp"
    lineage = json.loads((run_dir / "lineage.json").read_text())
    tags = run.data.tags
    assert tags["hpcpipe.config_hash"] == lineage["config_hash"]
    assert tags["hpcpipe.dataset_manifest_sha256"] == lineage["dataset_manifest_sha256"]
    assert tags["hpcpipe.world_size"] == "2" and tags["hpcpipe.hosts"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(1, STEPS + 1))
    assert {m.step for m in client.get_metric_history(run.info.run_id, "val_loss")} == {0, STEPS}
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "lineage.json", "summary.md", "eval.json", "report", "model"} <= top
    report = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert "report/report.html" in report

    # The registry: a version from the HF export, its lineage as tags, the alias on it.
    version = client.get_model_version_by_alias("tiny-gpt", "champion")
    exported = version.tags["hpcpipe.export"]
    assert (run_dir / "export" / exported).is_dir()
    assert version.run_id == run.info.run_id and version.source.startswith(
        f"runs:/{run.info.run_id}/model/{exported}-"
    )
    folder = version.source.split("/", 2)[2]  # model/<export>-<hash of its files>
    assert version.tags["hpcpipe.dataset_manifest_sha256"] == lineage["dataset_manifest_sha256"]
    assert version.tags["hpcpipe.git_sha"] == str(lineage["git_sha"])
    eval_result = json.loads((run_dir / "eval.json").read_text())
    assert float(version.tags["eval.val_loss"]) == pytest.approx(eval_result["metrics"]["val_loss"])
    champion_files = {a.path for a in client.list_artifacts(run.info.run_id, folder)}
    assert {f"{folder}/config.json", f"{folder}/model.safetensors"} <= champion_files
    shown = run_cli("models", "show", "tiny-gpt", "--tracking-uri", server.url, cwd=tmp_path)
    assert shown.returncode == 0 and "champion" in shown.stdout, shown.stderr
    # By hand: a second version from another export of the run, under another alias. Both once
    # went to model/: the champion's files became a mix of the two exports.
    other = run_dir / "export" / "0-other"
    other.mkdir()
    (other / "weights.bin").write_bytes(b"other")
    (other / ".hpcpipe-export").write_text(json.dumps({"checkpoint": "elsewhere", "files": ["weights.bin"]}))
    again = run_cli(
        "register", str(run_dir), "--name", "tiny-gpt", "--alias", "candidate", "--export", str(other),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert again.returncode == 0 and "version 2 (candidate)" in again.stdout, again.stderr
    assert {a.path for a in client.list_artifacts(run.info.run_id, folder)} == champion_files
    listed = run_cli("models", "list", "--json", "-", "--tracking-uri", server.url, cwd=tmp_path)
    aliases = {"champion": "1", "candidate": "2"}
    assert {"name": "tiny-gpt", "latest_version": 2, "aliases": aliases} in json.loads(listed.stdout)
    assert SECRET not in again.stdout + again.stderr

    # TensorBoard: scalars per logged step, evaluation, hyper-parameters, events as text.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, STEPS + 1))
    assert {e.step for e in events.Scalars("eval/val_loss")} == {0, STEPS}
    assert {"config/text_summary", "events/text_summary"} <= set(events.Tags()["tensors"])
    assert "_hparams_/experiment" in events.PluginTagToContent("hparams")

    # The password came only through the environment; nothing recorded it.
    assert SECRET not in proc.stdout + proc.stderr
    assert _files_holding(run_dir, SECRET) == []
    assert _files_holding(server.root / "artifacts", SECRET) == []
    assert all(SECRET not in v for v in [*run.data.params.values(), *run.data.tags.values()])


def test_a_server_stopped_mid_run_is_filled_in_by_track_sync(server: MlflowServer, tmp_path: Path) -> None:
    """The run reaches the server through a gate (tcp_gate.py): closed mid-run, the run sees a
    stopped server (refused, reset); opened again after it, the same URL answers for the sync
    (restarting the MLflow server itself took 30-50 s of the suite's time)."""
    # 30 steps of 0.3 s (two micro-steps held 0.15 s each): the first batch reaches the server
    # about 2 s in (BATCH_WINDOW_S), and the rest of the run, about 7 s, goes on past the closed gate.
    steps = 30
    gate = TcpGate(server.port).open()
    sets = tiny_job_sets(
        tmp_path, "gap", f"train.steps={steps}", "train.eval_every=0",
        f"observe.mlflow.tracking_uri={gate.url}", "observe.mlflow.close_timeout_s=2",
    )  # fmt: skip
    env_cmd = [sys.executable, "-m", "hpcpipe", "train", "tiny", *sets]
    env = {**os.environ, "HPCPIPE_CHAOS_SLOW": "where=data,seconds=0.15", "PYTHONUNBUFFERED": "1"}
    training = subprocess.Popen(
        env_cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    run_dir = tmp_path / "gap"
    client = server.client()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            started = (run_dir / "tracking" / "mlflow.json").is_file()
            if started and len(client.get_metric_history(_run_id(run_dir), "loss")) >= 3:
                break
            assert training.poll() is None, training.communicate()[1][-3000:]
            time.sleep(0.2)
        gate.close()  # mid-run: training goes on
        _, err = training.communicate(timeout=300)
    finally:
        if training.poll() is None:
            training.kill()
        gate.open()
    assert training.returncode == 0, err[-3000:]
    assert "hpcpipe track sync" in err  # the warning says how to fill the gap
    run_id = _run_id(run_dir)
    before = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert 3 <= len(before) < steps

    synced = run_cli("track", "sync", str(run_dir), "--json", "-", cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr
    result = json.loads(synced.stdout)
    assert result["run_id"] == run_id and result["finished"] and result["metrics"] > 0
    after = sorted(m.step for m in client.get_metric_history(run_id, "loss"))
    assert after == list(range(1, steps + 1))  # every step once: nothing sent twice
    assert client.get_run(run_id).info.status == "FINISHED"
    again = json.loads(run_cli("track", "sync", str(run_dir), "--json", "-", cwd=tmp_path).stdout)
    assert again["metrics"] == 0
    gate.close()


OWN = "tests.recipes_for_tests:Tiny"


def test_a_recipe_of_the_users_own_is_tracked_with_its_arguments_and_registered(
    server: MlflowServer, tmp_path: Path
) -> None:
    """A recipe outside hpcpipe (named by import path): its recipe.* arguments are run params, its
    metrics are tracked, its safetensors export is the registered model."""
    sets = [
        f"run.recipe={OWN}", "recipe.hidden=12", "run.name=own", f"run.out_dir={tmp_path}",
        "train.steps=4", "train.eval_every=2", "checkpoint.every_steps=2", "observe.log_every=1",
        "observe.mlflow.experiment=own-recipe", "pipeline.register_as=own-model",
    ]  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": _with_credentials(server.url)}
    args = [a for s in sets for a in ("--set", s)]
    proc = run_cli("run", "tiny", *args, cwd=tmp_path, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = server.client()
    run = client.get_run(_run_id(tmp_path / "own"))
    assert run.data.params["recipe.hidden"] == "12" and run.data.tags["hpcpipe.recipe"] == OWN
    assert {m.step for m in client.get_metric_history(run.info.run_id, "val_r2")} == {0, 2, 4}
    [version] = client.search_model_versions("name='own-model'")
    exported = version.tags["hpcpipe.export"]
    folder = version.source.split("/", 2)[2]  # model/<export>-<hash of its files>
    model_files = {a.path for a in client.list_artifacts(run.info.run_id, folder)}
    assert folder.startswith(f"model/{exported}-") and f"{folder}/model.safetensors" in model_files
    assert version.run_id == run.info.run_id
