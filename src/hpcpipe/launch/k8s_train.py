"""The train step on Kubernetes (``hpcpipe run --on k8s``): create the job ``launch k8s`` renders and
wait for it to end. What a Kubeflow Pipelines train step runs (``kfp/spec.py``).

A second attempt (KFP retries the step, or ``hpcpipe run`` again) waits for the job it created
when that job is still the same one: same kind and name, the same config in its ConfigMap, not
failed. Anything else under that name (a failed job, another config, a leftover ConfigMap, the
other API's job recorded in the run directory) is deleted, waited for, and created again, so
training resumes from its newest checkpoint; but only when it is this run's (the job its run
directory recorded, or the run's label where the run directory lies on a claim: ``k8s_cluster``'s
``_check_ours``). Another run's job of the same name is refused, untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcpipe.config import JobConfig
from hpcpipe.errors import UserError

if TYPE_CHECKING:
    from hpcpipe.launch.k8s_cluster import K8sJobRef

POLL_VAR = "HPCPIPE_K8S_POLL_S"  # seconds between status reads (default 10)


def train_on_k8s(job: JobConfig, api: str, say: Callable[[str], None]) -> None:
    """Create (or find) the job and wait; WorkerFailure(1) when it fails."""
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.job import WorkerFailure
    from hpcpipe.launch.kubernetes import APIS, render_k8s

    if api not in APIS:
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    k8s_cluster.require_client()
    recorded = recorded_job(job)
    docs = render_k8s(job, api, name=kept_name(job, recorded))  # type: ignore[arg-type]  # checked above
    connection = k8s_cluster.connect()
    poll = float(os.environ.get(POLL_VAR, "10"))
    _clear_other_api(recorded, docs, connection, poll)
    ref, running = k8s_cluster.reuse_or_clear(connection, docs, poll, recorded)
    if running:
        say(f"     waiting for {ref.kind} {ref.namespace}/{ref.name}, created before")
    else:
        ref = k8s_cluster.create(connection, docs)
        k8s_cluster.record_submission(job.run_dir, ref)
        say(f"     created {ref.kind} {ref.namespace}/{ref.name}")
    try:
        k8s_cluster.wait(connection, ref, poll_s=poll, say=lambda s: say(f"     {s}"))
    except k8s_cluster.JobFailed as exc:
        say(f"     {exc}")
        raise WorkerFailure(1) from None


def recorded_job(job: JobConfig) -> K8sJobRef | None:
    """The job this run directory recorded submitting, if any."""
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.layout import RunLayout

    if not RunLayout(job.run_dir).k8s_job.is_file():
        return None
    return k8s_cluster.resolve(job.run_dir)


def kept_name(job: JobConfig, recorded: K8sJobRef | None) -> str | None:
    """The name of the job this run directory recorded, where launch.k8s.name is unset and that
    name is not the one run.name gives now: hpcpipe before names ended in a hash gave ``tiny_gpt``
    the job ``tiny-gpt``, now ``tiny-gpt-db11a5``, and a retry deleted its running job to create
    one under the new name (``launch k8s --submit`` created a second job beside it, into the same
    run directory). None: ``job_name``. Every render that creates a run's job names it so."""
    from hpcpipe.launch.kubernetes import is_job_name

    cfg = job.launch.k8s
    if recorded is None or cfg.name is not None or recorded.namespace != cfg.namespace:
        return None
    return recorded.name if is_job_name(recorded.name) else None


def _clear_other_api(
    recorded: K8sJobRef | None, docs: list[dict[str, Any]], connection: object, poll_s: float
) -> None:
    """A job of the other API (or name) this run directory recorded is deleted: it would share
    the ConfigMap's name, and two jobs would train into one run directory."""
    from hpcpipe.launch import k8s_cluster

    if recorded is None:
        return
    wanted = {(d["kind"], d["metadata"]["name"]) for d in docs}
    if (recorded.kind, recorded.name) not in wanted and k8s_cluster.get_or_none(
        connection, recorded
    ) is not None:
        k8s_cluster.delete_and_wait(connection, recorded, poll_s)
