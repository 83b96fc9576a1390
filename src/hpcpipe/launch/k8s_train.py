"""The train step on Kubernetes (``hpcpipe run --on k8s``): create the job ``launch k8s`` renders and
wait for it to end. What a Kubeflow Pipelines train step runs (``launch/kfp.py``).

A second attempt (KFP retries the step, or ``hpcpipe run`` again) finds the job it created in the
run directory's submission record and waits for that one instead of creating another; a job that
failed is deleted and created again, so training resumes from its newest checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hpcpipe.config import JobConfig
from hpcpipe.errors import UserError

POLL_VAR = "HPCPIPE_K8S_POLL_S"  # seconds between status reads (default 10)


def train_on_k8s(job: JobConfig, api: str, say: Callable[[str], None]) -> None:
    """Create (or find) the job and wait; WorkerFailure(1) when it fails."""
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.job import WorkerFailure
    from hpcpipe.launch.kubernetes import APIS, render_k8s

    if api not in APIS:
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    k8s_cluster.require_client()
    docs = render_k8s(job, api)  # type: ignore[arg-type]  # checked against APIS above
    connection = k8s_cluster.connect()
    ref = _existing(job, connection)
    if ref is None:
        ref = k8s_cluster.create(connection, docs)
        k8s_cluster.record_submission(job.run_dir, ref)
        say(f"     created {ref.kind} {ref.namespace}/{ref.name}")
    else:
        say(f"     waiting for {ref.kind} {ref.namespace}/{ref.name}, created before")
    try:
        k8s_cluster.wait(
            connection, ref, poll_s=float(os.environ.get(POLL_VAR, "10")), say=lambda s: say(f"     {s}")
        )
    except k8s_cluster.JobFailed as exc:
        say(f"     {exc}")
        raise WorkerFailure(1) from None


def _existing(job: JobConfig, connection: object):  # type: ignore[no-untyped-def]  # K8sJobRef | None
    """The job this run directory recorded, if it still exists and has not failed (a failed one
    is deleted, with its ConfigMap, so that it can be created again)."""
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.layout import RunLayout

    if not RunLayout(job.run_dir).k8s_job.is_file():
        return None
    ref = k8s_cluster.resolve(job.run_dir)
    try:
        obj = k8s_cluster.get(connection, ref)
    except UserError:  # gone (deleted, or another cluster)
        return None
    failed = any(
        c.get("type") in k8s_cluster.FAILED_CONDITIONS and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )
    if failed:
        k8s_cluster.cancel(connection, ref)
        return None
    return ref
