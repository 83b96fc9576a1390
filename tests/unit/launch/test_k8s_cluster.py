"""``launch/k8s_cluster.py`` without a cluster: reading the job a run directory recorded, and what a
retry (``reuse_or_clear``) refuses to delete, the API stood in for by its module's functions. The
client path against a stand-in API server is in tests/integration/test_k8s_submit.py."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpcpipe.errors import UserError
from hpcpipe.launch import k8s_cluster
from hpcpipe.launch.k8s_cluster import K8sJobRef, record_submission, resolve


def test_a_recorded_job_reads_back(tmp_path: Path) -> None:
    job = K8sJobRef("PyTorchJob", "tiny", "ml", "kubeflow.org/v1", uid="0a1b")
    record_submission(tmp_path, job)
    assert resolve(tmp_path) == job


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"kind": "Job", "name": "x", "namespace": "default", "api_version": "batch/v1"}', "kind 'Job'"),
        (
            '{"kind": "TrainJob", "name": "x", "namespace": "default", "api_version": "v1alpha1"}',
            "group/version",
        ),
        ('{"kind": "TrainJob", "name": "x", "namespace": "d", "api_version": "a/b/c"}', "group/version"),
        ('{"kind": "TrainJob", "name": 3, "namespace": "d", "api_version": "a/b"}', "non-empty strings"),
        ('{"kind": "TrainJob", "name": "x", "namespace": "d", "api_version": "a/b", "uid": 4}', "uid 4"),
        ("[1]", "unreadable"),
        # Not strings: a list as kind was an unhashable-type TypeError traceback.
        ('{"kind": ["TrainJob"], "name": "x", "namespace": "d", "api_version": "a/b"}', r"kind \["),
        ('{"kind": {"a": 1}, "name": "x", "namespace": "d", "api_version": "a/b"}', r"kind \{'a'"),
        ('{"kind": "TrainJob", "name": ["x"], "namespace": "d", "api_version": "a/b"}', "non-empty strings"),
    ],
)
def test_a_record_hpcpipe_did_not_write_is_named(tmp_path: Path, record: str, message: str) -> None:
    """An unknown kind or an api_version without '/' was a KeyError or IndexError traceback in
    `hpcpipe jobs status|logs|cancel`, after a request to a path built from it."""
    (tmp_path / "k8s_job.json").write_text(record)
    with pytest.raises(UserError, match=f"{re.escape(str(tmp_path / 'k8s_job.json'))}: .*{message}"):
        resolve(tmp_path)


def _cluster(monkeypatch: pytest.MonkeyPatch, jobs: dict[str, dict[str, Any]], config_map: Any) -> list[Any]:
    """The API as ``reuse_or_clear`` reads it: ``jobs`` by kind (all of one name), the ConfigMap
    they share; what it would delete is returned, nothing deleted."""
    deleted: list[Any] = []
    monkeypatch.setattr(k8s_cluster, "get_or_none", lambda api, ref: jobs.get(ref.kind))
    monkeypatch.setattr(k8s_cluster, "_config_map", lambda api, ref: config_map)
    monkeypatch.setattr(k8s_cluster, "delete_and_wait", lambda api, ref, poll_s=2.0: deleted.append(ref))
    return deleted


def _held(doc: dict[str, Any], made: datetime | None = None) -> Any:
    """``doc`` (a rendered ConfigMap) as the client reads it back."""
    meta = SimpleNamespace(labels=doc["metadata"].get("labels"), creation_timestamp=made)
    return SimpleNamespace(data=doc["data"], metadata=meta)


def test_a_retry_leaves_the_configmap_of_a_running_job_of_the_other_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PyTorchJob `tiny` runs (default run.out_dir, no claim); a TrainJob `tiny` of the same
    run directory found no TrainJob, called the shared ConfigMap tiny-config left over, and
    deleted it (the running job's config) to create its own. A ConfigMap too new to tell from
    another submission's, its job not made yet, is left too; an old one with no job is cleared."""
    from hpcpipe.config import load_config
    from hpcpipe.launch.kubernetes import render_k8s

    theirs = render_k8s(load_config("tiny", ["launch.k8s.image=reg/img:1"]), "pytorchjob")
    ours = render_k8s(load_config("tiny", ["launch.k8s.image=reg/img:1", "train.steps=7"]), "trainjob")
    held = _held(theirs[0])
    running = {"metadata": {"uid": "u"}, "status": {}}
    deleted = _cluster(monkeypatch, {"PyTorchJob": running}, held)
    with pytest.raises(UserError, match=r"tiny-config is the PyTorchJob tiny's, not a TrainJob's: nothing"):
        k8s_cluster.reuse_or_clear(None, ours, 0.1)
    now = datetime.now(UTC)
    deleted = _cluster(monkeypatch, {}, _held(theirs[0], now - timedelta(seconds=5)))
    with pytest.raises(UserError, match=r"made 5 s ago and no TrainJob runs from it yet .*run again"):
        k8s_cluster.reuse_or_clear(None, ours, 0.1)
    assert not deleted
    deleted = _cluster(monkeypatch, {}, _held(theirs[0], now - timedelta(minutes=5)))
    assert k8s_cluster.reuse_or_clear(None, ours, 0.1) == (deleted[0], False)


def test_a_record_without_a_uid_is_not_called_no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """k8s_job.json from an older hpcpipe names the job but holds no uid: the refusal said it
    "records no such job"."""
    from hpcpipe.config import load_config
    from hpcpipe.launch.kubernetes import render_k8s

    before = render_k8s(load_config("tiny", ["launch.k8s.image=reg/img:1"]))
    now = render_k8s(load_config("tiny", ["launch.k8s.image=reg/img:1", "train.steps=7"]))
    _cluster(monkeypatch, {"TrainJob": {"metadata": {"uid": "u"}, "status": {}}}, _held(before[0]))
    job = before[1]
    recorded = K8sJobRef("TrainJob", job["metadata"]["name"], job["metadata"]["namespace"], job["apiVersion"])
    with pytest.raises(UserError, match=r"k8s_job\.json names it but holds no uid to prove it: nothing"):
        k8s_cluster.reuse_or_clear(None, now, 0.1, recorded)
    with pytest.raises(UserError, match=r"k8s_job\.json records no such job: nothing"):
        k8s_cluster.reuse_or_clear(None, now, 0.1, dataclasses.replace(recorded, name="other"))


def test_a_kind_the_user_may_not_read_is_said_not_taken_for_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 on another job kind (even one not installed: RBAC answers first) read as that
    kind's job holding the name: a retry's refusal said nothing of why, and create's 409 hint
    said a job of that name exists."""
    from kubernetes import client

    from hpcpipe.config import load_config
    from hpcpipe.launch.kubernetes import render_k8s

    theirs = render_k8s(load_config("tiny", ["launch.k8s.image=reg/img:1"]))
    ours = render_k8s(load_config("tiny", ["launch.k8s.image=reg/img:1", "train.steps=7"]))

    def forbidden(api: Any, ref: K8sJobRef) -> None:
        if ref.kind != "TrainJob":
            raise UserError(f"{ref.kind} {ref.namespace}/{ref.name}: Forbidden")

    _cluster(monkeypatch, {}, _held(theirs[0]))
    monkeypatch.setattr(k8s_cluster, "get_or_none", forbidden)
    with pytest.raises(UserError, match=r"whether a PyTorchJob of that name runs from it cannot be told .*"):
        k8s_cluster.reuse_or_clear(None, ours, 0.1)

    class Objects:
        def get_namespaced_custom_object(
            self, group: str, version: str, ns: str, plural: str, name: str
        ) -> None:
            raise client.ApiException(status=404 if plural == "trainjobs" else 403)

    job = ours[1]
    ref = K8sJobRef("TrainJob", job["metadata"]["name"], job["metadata"]["namespace"], job["apiVersion"])
    assert not k8s_cluster._job_exists(Objects(), ref)
    assert k8s_cluster._job_exists(Objects(), dataclasses.replace(ref, kind="PyTorchJob"))
