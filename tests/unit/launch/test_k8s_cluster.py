"""``launch/k8s_cluster.py`` without a cluster: reading the job a run directory recorded. The client
path against a stand-in API server is in tests/integration/test_k8s_submit.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcpipe.errors import UserError
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
