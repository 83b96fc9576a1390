"""What the Kubeflow pipeline's steps run (``hpcpipe launch kfp``), one pod each, through the real
``kubernetes`` client against the loopback stand-in for the API server (tests/integration/kube_api.py):
``hpcpipe run --only STEP --on k8s`` handing lineage records from step to step, the train step
creating the job and waiting for its end, and the Katib step creating the Experiment and writing
its best trial."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.helpers import run_cli, tiny_job_sets
from tests.integration.kube_api import KubeApi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _end_when_created(
    api: KubeApi, key: tuple[str, str, str], status: dict[str, Any], recreated: bool = False
) -> threading.Thread:
    """Give the object ``status`` as soon as it exists (as the operator would when it ends); with
    ``recreated``, once it has been deleted and created again."""

    old = api.objects.get(key) if recreated else None

    def watch() -> None:
        deadline = time.monotonic() + 120
        while api.objects.get(key) in (None, old) and time.monotonic() < deadline:
            time.sleep(0.05)
        if key in api.objects:
            api.objects[key]["status"] = status

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _condition(kind: str, message: str = "") -> dict[str, Any]:
    return {"conditions": [{"type": kind, "status": "True", "reason": kind, "message": message}]}


def test_steps_hand_their_records_on_and_train_waits_for_its_job(tmp_path: Path) -> None:
    records = tmp_path / "records"
    sets = tiny_job_sets(tmp_path, "tiny", "launch.k8s.namespace=ml")
    with KubeApi() as api:
        env = {
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig", "t0ken")),
            "HPCPIPE_K8S_POLL_S": "0.1",
        }

        def step(name: str, *extra: str) -> Any:
            args = [
                "run",
                "tiny",
                *sets,
                "--only",
                name,
                "--on",
                "k8s",
                "--record",
                str(records / f"{name}.json"),
            ]
            return run_cli(*args, *extra, env=env, cwd=tmp_path)

        done = step("prepare")
        assert done.returncode == 0, done.stderr
        prepared = json.loads((records / "prepare.json").read_text())
        assert prepared["step"] == "prepare" and prepared["status"] == "done" and prepared["outputs"]

        done = step("stage", "--upstream", str(records / "prepare.json"))
        assert done.returncode == 0, done.stderr  # each training pod stages its own node's disk
        assert json.loads((records / "stage.json").read_text())["status"] == "not-applicable"

        params = tmp_path / "best.json"
        params.write_text(json.dumps({"train.lr": "0.002"}))  # what the Katib step hands train
        watcher = _end_when_created(api, ("trainjobs", "ml", "tiny"), _condition("Complete"))
        done = step("train", "--upstream", str(records / "prepare.json"), "--params", str(params))
        watcher.join()
        assert done.returncode == 0, done.stderr
        assert "created TrainJob ml/tiny" in done.stdout
        config = yaml.safe_load(api.objects[("configmaps", "ml", "tiny-config")]["data"]["config.yaml"])
        assert config["train"]["lr"] == 0.002
        assert json.loads((records / "train.json").read_text())["status"] == "done"

        # Retried with the same config, train follows the job it made instead of a second one;
        # with another config, that job is deleted and created anew.
        posts = [
            r
            for r in api.requests
            if r == ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs")
        ]
        again = step("train", "--upstream", str(records / "prepare.json"), "--params", str(params))
        assert again.returncode == 0 and "created before" in again.stdout, again.stderr
        assert [r for r in api.requests if r == posts[0]] == posts
        params.write_text(json.dumps({"train.lr": "0.003"}))
        watcher = _end_when_created(api, ("trainjobs", "ml", "tiny"), _condition("Complete"), recreated=True)
        changed = step("train", "--upstream", str(records / "prepare.json"), "--params", str(params))
        watcher.join()
        assert changed.returncode == 0 and "created TrainJob ml/tiny" in changed.stdout, changed.stderr
        config = yaml.safe_load(api.objects[("configmaps", "ml", "tiny-config")]["data"]["config.yaml"])
        assert config["train"]["lr"] == 0.003

        # A record the run directory does not hold is refused before anything runs.
        forged = json.loads((records / "prepare.json").read_text())
        forged["outputs"] = {"dataset": "0" * 64}
        (records / "forged.json").write_text(json.dumps(forged))
        refused = step("evaluate", "--upstream", str(records / "forged.json"))
        assert refused.returncode == 2 and "does not hold the outputs" in refused.stderr
        assert refused.stderr.count("\n") == 1


def test_a_failed_job_fails_the_train_step_and_a_retry_creates_it_again(tmp_path: Path) -> None:
    sets = tiny_job_sets(tmp_path, "tiny")
    with KubeApi() as api:
        env = {
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig", "t0ken")),
            "HPCPIPE_K8S_POLL_S": "0.1",
        }
        assert run_cli("run", "tiny", *sets, "--only", "prepare", env=env, cwd=tmp_path).returncode == 0
        watcher = _end_when_created(
            api, ("pytorchjobs", "default", "tiny"), _condition("Failed", "pod OOMKilled")
        )
        train = ["run", "tiny", *sets, "--on", "k8s", "--api", "pytorchjob", "--only", "train"]
        failed = run_cli(*train, env=env, cwd=tmp_path)
        watcher.join()
        assert failed.returncode == 1 and "failed: pod OOMKilled" in failed.stderr + failed.stdout

        # The retry finds the failed job through the run directory, deletes it and creates it again.
        watcher = _end_when_created(
            api, ("pytorchjobs", "default", "tiny"), _condition("Succeeded"), recreated=True
        )
        retried = run_cli(*train, env=env, cwd=tmp_path)
        watcher.join()
        assert retried.returncode == 0, retried.stderr
        deletes = [path for method, path in api.requests if method == "DELETE"]
        assert "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs/tiny" in deletes


def _connect_to(api: KubeApi, tmp_path: Path, monkeypatch: Any) -> None:
    from hpcpipe.launch import k8s_cluster

    # Not $KUBECONFIG: the client reads it once, when first imported (by an earlier test, too).
    connect, kubeconfig = k8s_cluster.connect, api.write_kubeconfig(tmp_path / "kubeconfig", "t0ken")
    monkeypatch.setattr(k8s_cluster, "connect", lambda: connect(kubeconfig))
    monkeypatch.setenv("HPCPIPE_K8S_POLL_S", "0.05")


def _shared_name_job(tmp_path: Path, name: str, *extra: str) -> Any:
    from hpcpipe.config import load_config

    return load_config(
        "tiny", [f"run.out_dir={tmp_path}", f"run.name={name}", "launch.k8s.name=shared", *extra]
    )


def test_the_train_step_deletes_only_its_own_run_s_job(tmp_path: Path, monkeypatch: Any) -> None:
    """Two runs whose job names match (launch.k8s.name, or run.name cut and rewritten): the
    second's train step deleted the first's running job and ConfigMap. Now it refuses, and deletes
    only a job of its own run (here one with another config, which it creates again). The same
    path on another team's claim is another run: the label was a hash of the path alone."""
    from hpcpipe.errors import UserError
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.k8s_train import train_on_k8s
    from hpcpipe.launch.kubernetes import render_k8s

    def job(name: str, *extra: str, claim: str = "team-a-runs") -> Any:
        on_claim = [f"launch.k8s.runs_pvc={claim}", f"launch.k8s.runs_mount={tmp_path}"]
        return _shared_name_job(tmp_path, name, *on_claim, *extra)

    key = ("trainjobs", "default", "shared")
    with KubeApi() as api:
        _connect_to(api, tmp_path, monkeypatch)
        first = k8s_cluster.create(k8s_cluster.connect(), render_k8s(job("seed0")))
        watcher = _end_when_created(api, key, _condition("Complete"), recreated=True)  # ends a new one
        with pytest.raises(
            UserError, match=f"belongs to the run {tmp_path}/seed0, not this run: nothing deleted"
        ):
            train_on_k8s(job("seed1"), "trainjob", print)
        with pytest.raises(UserError, match=r"names this run directory .*, but it is not labelled as on"):
            train_on_k8s(job("seed0", claim="team-b-runs"), "trainjob", print)
        assert api.objects[key]["metadata"]["uid"] == first.uid
        first_job = api.objects.pop(key)  # deleted with kubectl, which leaves its ConfigMap
        with pytest.raises(UserError, match="belongs to the run"):
            train_on_k8s(job("seed1"), "trainjob", print)
        assert not [path for method, path in api.requests if method == "DELETE"]

        api.objects[key] = first_job
        train_on_k8s(job("seed0", "train.steps=3"), "trainjob", print)  # its own run, another config
        watcher.join()
        assert api.objects[key]["metadata"]["uid"] != first.uid


def test_off_a_claim_only_the_record_makes_a_job_the_run_s(tmp_path: Path, monkeypatch: Any) -> None:
    """Without a claim the run directory is on the submitting machine: two teams with the default
    run.out_dir give one path and one label, and one's train step deleted the other's job. A job
    labelled by the path alone (before the claim was in the label) is likewise no proof."""
    from hpcpipe.errors import UserError
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.k8s_train import train_on_k8s
    from hpcpipe.launch.kubernetes import RUN_LABEL, render_k8s

    key = ("trainjobs", "default", "shared")
    with KubeApi() as api:
        _connect_to(api, tmp_path, monkeypatch)
        theirs = k8s_cluster.create(k8s_cluster.connect(), render_k8s(_shared_name_job(tmp_path, "seed0")))
        with pytest.raises(
            UserError, match=r"names this run directory .*seed0, but run.out_dir is on no claim"
        ) as got:
            train_on_k8s(_shared_name_job(tmp_path, "seed0", "train.steps=3"), "trainjob", print)
        assert "belongs to" not in str(got.value) and "kubectl delete trainjob shared" in str(got.value)
        on_claim = ["launch.k8s.checkpoint_pvc=ckpt", f"launch.k8s.checkpoint_mount={tmp_path}"]
        old_label = api.objects[key]
        old_label["metadata"]["labels"][RUN_LABEL] = "34697fdce8d632ce"  # a hash of the path alone
        with pytest.raises(UserError, match="nothing deleted"):
            train_on_k8s(_shared_name_job(tmp_path, "seed0", *on_claim), "trainjob", print)
        assert api.objects[key]["metadata"]["uid"] == theirs.uid
        assert not [path for method, path in api.requests if method == "DELETE"]

        # The run's own record (k8s_job.json, with the job's uid) proves it: deleted, made again.
        k8s_cluster.record_submission(tmp_path / "seed0", theirs)
        watcher = _end_when_created(api, key, _condition("Complete"), recreated=True)
        train_on_k8s(_shared_name_job(tmp_path, "seed0", "train.steps=3"), "trainjob", print)
        watcher.join()
        assert api.objects[key]["metadata"]["uid"] != theirs.uid


def test_off_a_claim_a_retry_clears_the_configmap_its_deleted_job_left(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`kubectl delete trainjob` leaves the ConfigMap: the retry called it the job of "the run
    <this run's own directory>" and refused. No job runs from a ConfigMap naming this run
    directory: it is cleared, and the job created again."""
    from hpcpipe.config import load_config
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.k8s_train import train_on_k8s
    from hpcpipe.launch.kubernetes import render_k8s

    job = load_config("tiny", [f"run.out_dir={tmp_path}", "run.name=mine"])
    key = ("trainjobs", "default", "mine")
    with KubeApi() as api:
        _connect_to(api, tmp_path, monkeypatch)
        first = k8s_cluster.create(k8s_cluster.connect(), render_k8s(job))
        k8s_cluster.record_submission(job.run_dir, first)
        api.objects.pop(key)  # kubectl delete trainjob mine
        watcher = _end_when_created(api, key, _condition("Complete"))
        train_on_k8s(job, "trainjob", print)
        watcher.join()
        assert api.objects[key]["metadata"]["uid"] != first.uid


def test_a_retry_follows_the_job_its_run_recorded_under_an_older_name(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """run.name tiny_gpt gave the job tiny-gpt before names rewritten from run.name ended in a
    hash (tiny-gpt-db11a5 now): a retry after the upgrade deleted the running job it had recorded
    and created another under the new name. It follows the recorded one now."""
    from hpcpipe.config import load_config
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.k8s_train import train_on_k8s
    from hpcpipe.launch.kubernetes import job_name, render_k8s, to_yaml

    job = load_config("tiny", [f"run.out_dir={tmp_path}", "run.name=tiny_gpt"])
    assert job_name(job) == "tiny-gpt-db11a5"
    older = list(yaml.safe_load_all(to_yaml(render_k8s(job)).replace("tiny-gpt-db11a5", "tiny-gpt")))
    with KubeApi() as api:
        _connect_to(api, tmp_path, monkeypatch)
        before = k8s_cluster.create(k8s_cluster.connect(), older)
        k8s_cluster.record_submission(job.run_dir, before)
        watcher = _end_when_created(api, ("trainjobs", "default", "tiny-gpt"), _condition("Complete"))
        # Ends a job made under the new name too, so that the old behaviour fails here, not hangs.
        _end_when_created(api, ("trainjobs", "default", "tiny-gpt-db11a5"), _condition("Complete"))
        said: list[str] = []
        train_on_k8s(job, "trainjob", said.append)
        watcher.join()
        assert said[0] == "     waiting for TrainJob default/tiny-gpt, created before", said
        assert not [path for method, path in api.requests if method == "DELETE"]
        assert not [key for key in api.objects if key[2].startswith("tiny-gpt-db11a5")]


def test_the_katib_step_creates_the_experiment_and_writes_the_best_trial(tmp_path: Path) -> None:
    best = tmp_path / "best.json"
    space = "hpo.space={train.lr: {type: float, low: 1.0e-4, high: 1.0, log: true}}"  # Katib: no `when`
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "launch.k8s.namespace=ml", "--set", space]
    with KubeApi() as api:
        env = {
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig", "t0ken")),
            "HPCPIPE_K8S_POLL_S": "0.1",
        }
        status = _condition("Succeeded") | {
            "currentOptimalTrial": {
                "parameterAssignments": [{"name": "train-lr", "value": "0.0031"}],
                "observation": {"metrics": [{"name": "val_loss", "latest": "2.1"}]},
            }
        }
        watcher = _end_when_created(api, ("experiments", "ml", "tiny-hpo"), status)
        args = ["hpo", "launch", "katib", "tiny-hpo", *sets, "--submit", "--wait", "--best", str(best)]
        done = run_cli(*args, env=env, cwd=tmp_path)
        watcher.join()
        assert done.returncode == 0, done.stderr
        assert json.loads(best.read_text()) == {"train.lr": "0.0031"}
        assert {key[0] for key in api.objects} == {"configmaps", "experiments"}

        refused = run_cli(
            "hpo", "launch", "katib", "tiny-hpo", *sets, "--best", str(best), env=env, cwd=tmp_path
        )
        assert refused.returncode == 2 and "--best needs --wait" in refused.stderr
