"""A Kubernetes cluster through the ``kubernetes`` client: create rendered objects, follow a job,
read its pods' logs, delete it. The user's kubeconfig (or the pod's service account) decides
where and as whom; nothing here reads or prints a credential.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from hpcpipe.errors import UserError
from hpcpipe.launch.k8s_run_place import run_dir_in, shared_place, unproven
from hpcpipe.layout import RunLayout

P = ParamSpec("P")
R = TypeVar("R")
SUBMISSION_FILE = RunLayout.K8S_JOB  # in the run directory
# The label each operator puts on a job's pods.
_POD_SELECTOR = {
    "TrainJob": "jobset.sigs.k8s.io/jobset-name={name}",
    "PyTorchJob": "training.kubeflow.org/job-name={name}",
}
_PLURALS = {
    "TrainJob": "trainjobs",
    "PyTorchJob": "pytorchjobs",
    "ClusterTrainingRuntime": "clustertrainingruntimes",
    "Experiment": "experiments",
}
_JOB_KINDS = (*_POD_SELECTOR, "Experiment")  # what `create` submits with its ConfigMap
# Each kind's group/version as the renderers write it (kubernetes.py, hpo/katib.py). All kinds name
# their ConfigMap <name>-config, so a job of one kind and a job of another of that name share it.
_API_VERSIONS = {
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "PyTorchJob": "kubeflow.org/v1",
    "Experiment": "kubeflow.org/v1beta1",
}
# A ConfigMap without its job younger than this may be another `create`'s, between the two.
_LEFTOVER_AGE_S = 60.0
# Condition types that end a job: Trainer v2 says Complete, Training Operator v1 and Katib Succeeded.
DONE_CONDITIONS = ("Complete", "Succeeded")
FAILED_CONDITIONS = ("Failed",)
ENDING_CONDITIONS = (*DONE_CONDITIONS, *FAILED_CONDITIONS)
_CONTAINER = {"TrainJob": "node", "PyTorchJob": "pytorch"}


@dataclass(frozen=True)
class K8sJobRef:
    kind: str
    name: str
    namespace: str
    api_version: str  # group/version
    uid: str | None = None  # the object the API server made: a later job of the same name is another

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/")[1]

    @property
    def plural(self) -> str:
        return _PLURALS[self.kind]


def _one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """An unreachable API server, or a refusal not handled inside, as one line (exit 2)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from kubernetes.client import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return func(*args, **kwargs)
        except HTTPError as exc:
            raise UserError(
                f"cannot reach the Kubernetes API server ({type(exc).__name__}); check the kubeconfig"
            ) from None
        except ApiException as exc:
            raise UserError(f"Kubernetes API: {_reason(exc)}") from None

    return wrapper


def require_client() -> None:
    try:
        import kubeflow.training  # noqa: F401
        import kubeflow_trainer_api  # noqa: F401
        import kubernetes  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"launch k8s needs the k8s extra ({exc.name} is missing): pip install 'hpcpipe[k8s]'"
        ) from None


def connect(kubeconfig: Path | None = None, context: str | None = None) -> Any:
    """An ``ApiClient`` for the cluster: the given kubeconfig, $KUBECONFIG, ~/.kube/config, or
    the pod's own service account."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if kubeconfig is not None and not kubeconfig.is_file():
        raise UserError(f"--kubeconfig {kubeconfig}: no such file")
    try:
        if kubeconfig is None and _in_cluster():
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context)
    except (ConfigException, OSError) as exc:
        raise UserError(
            f"no usable kubeconfig ({str(exc).splitlines()[0][:160]}); set KUBECONFIG or pass --kubeconfig"
        ) from None
    return client.ApiClient()


def _in_cluster() -> bool:
    import os

    return (
        "KUBERNETES_SERVICE_HOST" in os.environ
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").is_file()
    )


@_one_line_errors
def create(api: Any, docs: list[dict[str, Any]]) -> K8sJobRef:
    """Create the objects: a shared runtime first (left as it is when it already holds this
    job's settings, refused when it holds others: it is never replaced), then the ConfigMap,
    then the job; when the job is refused, its ConfigMap is deleted again."""
    from kubernetes import client

    by_kind = {doc["kind"]: doc for doc in docs}
    jobs = [doc for doc in docs if doc["kind"] in _JOB_KINDS]
    if len(jobs) != 1 or "ConfigMap" not in by_kind:
        raise UserError("nothing to submit: the manifests need one ConfigMap and one job")
    job_doc, config_map = jobs[0], by_kind["ConfigMap"]
    meta = job_doc["metadata"]
    job = K8sJobRef(job_doc["kind"], meta["name"], meta["namespace"], job_doc["apiVersion"])
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    try:
        if "ClusterTrainingRuntime" in by_kind:
            _create_or_replace_cluster_object(api, by_kind["ClusterTrainingRuntime"])
    except client.ApiException as exc:
        raise UserError(f"{job.kind} {job.namespace}/{job.name}: {_reason(exc)} ({_hint(exc)})") from None
    config_map_name = config_map["metadata"]["name"]
    try:
        core.create_namespaced_config_map(job.namespace, config_map)
    except client.ApiException as exc:
        if exc.status != 409 or _job_exists(objects, job):
            raise UserError(f"{job.kind} {job.namespace}/{job.name}: {_reason(exc)} ({_hint(exc)})") from None
        raise UserError(  # left behind by a job deleted with kubectl, which keeps its ConfigMap
            f"ConfigMap {job.namespace}/{config_map_name}: {_reason(exc)} (no {job.kind} of that name "
            f"exists: kubectl delete configmap {config_map_name} -n {job.namespace}, or set launch.k8s.name)"
        ) from None
    try:
        made = objects.create_namespaced_custom_object(
            job.group, job.version, job.namespace, job.plural, job_doc
        )
    except client.ApiException as exc:
        with contextlib.suppress(client.ApiException):  # the refusal is what the user needs to see
            core.delete_namespaced_config_map(config_map_name, job.namespace)
        raise UserError(f"{job.kind} {job.namespace}/{job.name}: {_reason(exc)} ({_hint(exc)})") from None
    uid = made.get("metadata", {}).get("uid") if isinstance(made, dict) else None
    return dataclasses.replace(job, uid=uid)


def _job_exists(objects: Any, job: K8sJobRef) -> bool:
    """Whether a job of any kind holds the name, and so may use its ConfigMap (True when the API
    will not say of the job's own kind: the safer hint; another kind it may not read, a 403 where
    that API is not even installed, does not count)."""
    from kubernetes import client

    for kind in _JOB_KINDS:
        group, version = _API_VERSIONS[kind].split("/")
        try:
            objects.get_namespaced_custom_object(group, version, job.namespace, _PLURALS[kind], job.name)
        except client.ApiException as exc:
            if exc.status != 404 and kind == job.kind:
                return True
        else:
            return True
    return False


def _hint(exc: Any) -> str:
    if exc.status == 409:
        return "a job of that name exists: hpcpipe jobs cancel RUN_DIR, or set launch.k8s.name"
    if exc.status == 404:
        return "is the Kubeflow operator installed, and the namespace there?"
    if exc.status in (401, 403):
        return "the kubeconfig's user may not create it"
    return "the API server refused it"


def _create_or_replace_cluster_object(api: Any, doc: dict[str, Any]) -> None:
    from kubernetes import client

    group, version = doc["apiVersion"].split("/")
    objects = client.CustomObjectsApi(api)
    plural, name = _PLURALS[doc["kind"]], doc["metadata"]["name"]
    try:
        objects.create_cluster_custom_object(group, version, plural, doc)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        current = objects.get_cluster_custom_object(group, version, plural, name)
        if not _holds(current.get("spec"), doc["spec"]):  # other jobs run on it: never replaced
            raise UserError(
                f"{doc['kind']} {name} exists with other settings (priority class, ports, image, "
                f"restarts), and other jobs may run on it: submit without --runtime to run on it as "
                f"it is, or delete it (kubectl delete {plural} {name}) to install this job's"
            ) from None


def _holds(current: Any, wanted: Any) -> bool:
    """``current`` has every field of ``wanted`` with its value (the API server adds defaults)."""
    if isinstance(wanted, dict):
        return isinstance(current, dict) and all(_holds(current.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(current, list)
            and len(current) == len(wanted)
            and all(_holds(c, w) for c, w in zip(current, wanted, strict=True))
        )
    return bool(current == wanted)


def record_submission(run_dir: Path, job: K8sJobRef) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SUBMISSION_FILE
    path.write_text(json.dumps(asdict(job), indent=1) + "\n")
    return path


def resolve(run_dir: Path) -> K8sJobRef:
    """The job ``run_dir`` recorded; UserError naming the record where it is not one hpcpipe wrote."""
    record = run_dir / SUBMISSION_FILE
    try:
        job = K8sJobRef(**json.loads(record.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"{record}: unreadable ({exc})") from None
    # Each field picks an API path (and, for kind, the pods' selector): checked before any request,
    # its type first (a list as kind was an unhashable-type TypeError in the lookup).
    if not isinstance(job.kind, str) or job.kind not in _POD_SELECTOR:
        raise UserError(f"{record}: kind {job.kind!r} is not one of {', '.join(_POD_SELECTOR)}")
    if not all(isinstance(v, str) and v for v in (job.name, job.namespace, job.api_version)):
        raise UserError(f"{record}: name, namespace and api_version must be non-empty strings")
    if not isinstance(job.uid, str | None):
        raise UserError(f"{record}: uid {job.uid!r} is not a string")
    if len(job.api_version.split("/")) != 2 or not all(job.api_version.split("/")):
        raise UserError(f"{record}: api_version {job.api_version!r} is not group/version")
    return job


@_one_line_errors
def status(api: Any, job: K8sJobRef) -> dict[str, Any]:
    """The job's conditions and its pods (phase, node, restarts)."""
    obj = get(api, job)
    conditions = [
        {k: c.get(k, "") for k in ("type", "status", "reason", "message")}
        for c in obj.get("status", {}).get("conditions", [])
    ]
    pods = [
        {
            "pod": pod.metadata.name,
            "phase": pod.status.phase or "",
            "node": pod.spec.node_name or "",
            "restarts": sum(cs.restart_count for cs in pod.status.container_statuses or []),
        }
        for pod in _pods(api, job)
    ]
    return {
        "job": f"{job.kind}/{job.name}",
        "namespace": job.namespace,
        "conditions": conditions,
        "pods": pods,
    }


class JobFailed(RuntimeError):
    """The job ended with a Failed condition."""


TRANSIENT_LIMIT_S = 600.0  # how long `wait` rides out an unreachable or overloaded API server


def wait(
    api: Any, job: K8sJobRef, poll_s: float = 10.0, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Poll ``job`` until a condition ends it; returns the object. JobFailed on a Failed condition
    (its reason and message); a vanished job, or an API server away for TRANSIENT_LIMIT_S, is a
    UserError. A restart of the API server during hours of training does not end the wait."""
    import time

    last, failing_since = "", None
    while True:
        try:
            obj = find(api, job)
            failing_since = None
        except _Transient as exc:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > TRANSIENT_LIMIT_S:
                raise UserError(f"{job.kind} {job.namespace}/{job.name}: {exc}") from None
            time.sleep(poll_s)
            continue
        if obj is None:
            raise UserError(f"{job.kind} {job.namespace}/{job.name}: not found (deleted?)")
        conditions = obj.get("status", {}).get("conditions", [])
        ended = [c for c in conditions if c.get("status") == "True" and c.get("type") in ENDING_CONDITIONS]
        if ended:
            condition = ended[-1]
            if condition["type"] in FAILED_CONDITIONS:
                detail = condition.get("message") or condition.get("reason") or "no reason given"
                raise JobFailed(f"{job.kind} {job.namespace}/{job.name} failed: {detail}")
            return obj
        state = ", ".join(c.get("type", "") for c in conditions if c.get("status") == "True")
        if say is not None and state != last:
            say(f"{job.kind} {job.name}: {state or 'created'}")
            last = state
        time.sleep(poll_s)


class _Transient(Exception):
    """The API server did not answer usefully (unreachable, 429, 5xx): worth asking again."""


def find(api: Any, job: K8sJobRef) -> dict[str, Any] | None:
    """The job's object; None when it does not exist (404); _Transient when the server is away;
    UserError for any other refusal (403, ...)."""
    from kubernetes import client
    from urllib3.exceptions import HTTPError

    try:
        obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            job.group, job.version, job.namespace, job.plural, job.name
        )
    except HTTPError as exc:
        raise _Transient(f"cannot reach the Kubernetes API server ({type(exc).__name__})") from None
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status == 429 or exc.status >= 500:
            raise _Transient(_reason(exc)) from None
        raise UserError(f"{job.kind} {job.namespace}/{job.name}: {_reason(exc)}") from None
    return obj


@_one_line_errors
def get(api: Any, job: K8sJobRef) -> dict[str, Any]:
    try:
        obj = find(api, job)
    except _Transient as exc:
        raise UserError(f"{job.kind} {job.namespace}/{job.name}: {exc}") from None
    if obj is None:
        raise UserError(f"{job.kind} {job.namespace}/{job.name}: not found")
    return obj


@_one_line_errors
def config_text(api: Any, job: K8sJobRef) -> str | None:
    """The config.yaml of the job's ConfigMap; None when there is none."""
    held = _config_map(api, job)
    return None if held is None else (held.data or {}).get(RunLayout.CONFIG)


def _config_map(api: Any, job: K8sJobRef) -> Any | None:
    """The job's ConfigMap (a ``V1ConfigMap``); None when there is none."""
    from kubernetes import client

    try:
        return client.CoreV1Api(api).read_namespaced_config_map(f"{job.name}-config", job.namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise UserError(f"ConfigMap {job.namespace}/{job.name}-config: {_reason(exc)}") from None


def delete_and_wait(api: Any, job: K8sJobRef, poll_s: float = 2.0, timeout_s: float = 600.0) -> None:
    """``cancel``, then wait until the job is gone: a foreground deletion keeps the object while
    its pods go, and creating one of the same name meanwhile is refused (409)."""
    import time

    cancel(api, job)
    deadline = time.monotonic() + timeout_s
    while get_or_none(api, job) is not None:
        if time.monotonic() > deadline:
            raise UserError(
                f"{job.kind} {job.namespace}/{job.name}: still being deleted after {timeout_s:.0f} s"
            )
        time.sleep(poll_s)


@_one_line_errors
def reuse_or_clear(
    api: Any, docs: list[dict[str, Any]], poll_s: float, recorded: K8sJobRef | None = None
) -> tuple[K8sJobRef, bool]:
    """The job of ``docs`` and whether it already runs them: it exists, has not failed, and its
    ConfigMap holds the same config. Otherwise whatever holds its name (a failed job, another
    config, a leftover ConfigMap) is deleted and waited for, so that ``create`` can follow, when
    it is this run's (``_check_ours``); another run's job of the same name is refused, untouched."""
    [doc] = [d for d in docs if d["kind"] in _JOB_KINDS]
    ref = K8sJobRef(doc["kind"], doc["metadata"]["name"], doc["metadata"]["namespace"], doc["apiVersion"])
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    obj, held = get_or_none(api, ref), _config_map(api, ref)
    if obj is None and held is None:
        return ref, False
    if obj is None:
        _refuse_busy_config_map(api, ref, held)
    same_config = held is not None and (held.data or {}).get(RunLayout.CONFIG) == config_map["data"].get(
        RunLayout.CONFIG
    )
    failed = obj is not None and any(
        c.get("type") in FAILED_CONDITIONS and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )
    uid = None if obj is None else obj.get("metadata", {}).get("uid")
    if obj is not None and not failed and same_config:
        return dataclasses.replace(ref, uid=uid), True
    # The same config names the same run directory, and on a claim that is one place: this run's.
    if not (same_config and shared_place(config_map["data"].get(RunLayout.CONFIG)) is not None):
        _check_ours(ref, docs, obj, held, recorded)
    delete_and_wait(api, dataclasses.replace(ref, uid=uid), poll_s)  # that object, not a newer one
    return ref, False


def _refuse_busy_config_map(api: Any, ref: K8sJobRef, held: Any) -> None:
    """UserError unless the ConfigMap holding ``ref``'s name without its job is left over: a job of
    another kind of that name runs from it, or it is too new to tell from one another ``create``
    made and has not yet made its job beside."""
    from datetime import UTC, datetime

    cm = f"ConfigMap {ref.namespace}/{ref.name}-config"
    for kind in _JOB_KINDS:
        other = K8sJobRef(kind, ref.name, ref.namespace, _API_VERSIONS[kind])
        try:
            found = None if kind == ref.kind else get_or_none(api, other)
        except UserError as exc:  # no leave to read that kind (a 403, even where it is not installed)
            raise UserError(
                f"{cm} has no {ref.kind}, and whether a {kind} of that name runs from it cannot be told "
                f"({exc}): nothing deleted; if it is left over, kubectl delete configmap {ref.name}-config "
                f"-n {ref.namespace}"
            ) from None
        if found is not None:
            raise UserError(
                f"{cm} is the {kind} {ref.name}'s, not a {ref.kind}'s: nothing deleted; set "
                f"launch.k8s.name (or another run.name) to run this one beside it, or, if that job is "
                f"this run's, delete it (kubectl delete {kind.lower()} {ref.name} -n {ref.namespace})"
            )
    made = getattr(held.metadata, "creation_timestamp", None)
    # An API server always sets it; only a stand-in leaves it out, so none counts as old.
    age = None if made is None else (datetime.now(UTC) - made).total_seconds()
    if age is not None and age < _LEFTOVER_AGE_S:
        raise UserError(
            f"{cm} was made {max(age, 0):.0f} s ago and no {ref.kind} runs from it yet (another "
            "submission may be about to create it): nothing deleted; run again in a minute"
        )


def _check_ours(
    ref: K8sJobRef,
    docs: list[dict[str, Any]],
    obj: dict[str, Any] | None,
    held: Any,
    recorded: K8sJobRef | None,
) -> None:
    """UserError unless what holds ``ref``'s name is this run's: it is the job ``recorded`` in the
    run directory, or, where the run directory lies on a claim, it carries this run's label (a hash
    of namespace, claim and path: ``place_label``) or, from before the label, its ConfigMap names
    that place, or the job is gone and its ConfigMap, left behind (``kubectl delete``), names this
    run directory. Job names come from run.name, cut and rewritten, or from launch.k8s.name: two runs
    can share one, and neither may delete the other's. A label of the path alone (hpcpipe before
    the claim was in it) proves nothing: the same path on two claims is two runs."""
    from hpcpipe.launch.kubernetes import RUN_LABEL

    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    ours = shared_place(config_map["data"].get(RunLayout.CONFIG))
    meta = obj.get("metadata", {}) if obj is not None else {}
    labels = meta.get("labels") if obj is not None else getattr(held.metadata, "labels", None)
    theirs = (labels or {}).get(RUN_LABEL)
    their_config = (held.data or {}).get(RunLayout.CONFIG) if held is not None else None
    if recorded is not None and recorded.uid is not None and recorded.uid == meta.get("uid"):
        return
    if ours is not None and (theirs == ours or (theirs is None and shared_place(their_config) == ours)):
        return
    their_dir = run_dir_in(their_config)
    same_dir = their_dir is not None and their_dir == run_dir_in(config_map["data"].get(RunLayout.CONFIG))
    if obj is None and same_dir:  # only a ConfigMap left (kubectl delete): no job runs from it
        return
    beside = "set launch.k8s.name (or another run.name) to run this one beside it"
    if same_dir:  # this run's path, yet nothing proves it is this run's: say why, not "another run"
        raise UserError(
            f"{ref.kind} {ref.namespace}/{ref.name} names this run directory {their_dir}, but "
            f"{unproven(ours)}, and {_record_says(ref, recorded)}: nothing deleted; if it is "
            f"this run's, delete it (kubectl delete {ref.kind.lower()} {ref.name} -n {ref.namespace}) "
            f"and run again, else {beside}"
        )
    # Without a claim the run directory is on the submitting machine and the pods' own disks: the
    # same path there (the default run.out_dir) is no one place, and only the record tells.
    why = "" if ours is not None else " (run.out_dir is on no claim of launch.k8s: only k8s_job.json tells)"
    raise UserError(
        f"{ref.kind} {ref.namespace}/{ref.name} belongs to "
        f"{f'the run {their_dir}' if their_dir else 'another run'}, not this run{why}: nothing deleted; "
        f"{beside}"
    )


def _record_says(ref: K8sJobRef, recorded: K8sJobRef | None) -> str:
    """What the run's k8s_job.json says of ``ref``, whose uid it does not hold."""
    named = recorded is not None and (recorded.kind, recorded.name, recorded.namespace) == (
        ref.kind,
        ref.name,
        ref.namespace,
    )
    if named and recorded is not None and recorded.uid is None:  # an older hpcpipe recorded no uid
        return "k8s_job.json names it but holds no uid to prove it"
    return "k8s_job.json records no such job"


@_one_line_errors
def get_or_none(api: Any, job: K8sJobRef) -> dict[str, Any] | None:
    try:
        return find(api, job)
    except _Transient as exc:
        raise UserError(f"{job.kind} {job.namespace}/{job.name}: {exc}") from None


@_one_line_errors
def logs(api: Any, job: K8sJobRef, tail: int | None) -> dict[str, str]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    return {
        pod.metadata.name: core.read_namespaced_pod_log(
            pod.metadata.name, job.namespace, container=_CONTAINER[job.kind], tail_lines=tail
        )
        for pod in _pods(api, job)
    }


@_one_line_errors
def cancel(api: Any, job: K8sJobRef) -> None:
    """Delete the job (its pods go with it) and its ConfigMap; only the job this run submitted
    (its uid, where recorded): names come from run.name, and an old run directory, or a
    colleague's run of the same name, named whichever job holds the name now."""
    from kubernetes import client

    options = client.V1DeleteOptions(
        propagation_policy="Foreground",
        preconditions=client.V1Preconditions(uid=job.uid) if job.uid else None,
    )
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            job.group, job.version, job.namespace, job.plural, job.name, body=options
        )
    except client.ApiException as exc:
        if exc.status == 409 and job.uid:
            raise UserError(
                f"{job.kind} {job.namespace}/{job.name} is another job now, not the one this run "
                "submitted; nothing deleted"
            ) from None
        if exc.status != 404:
            raise UserError(f"deleting {job.kind} {job.name}: {_reason(exc)}") from None
    try:  # on its own: a job already gone may leave its ConfigMap behind
        client.CoreV1Api(api).delete_namespaced_config_map(f"{job.name}-config", job.namespace)
    except client.ApiException as exc:
        if exc.status != 404:
            raise UserError(f"deleting {job.kind} {job.name}: {_reason(exc)}") from None


def _pods(api: Any, job: K8sJobRef) -> list[Any]:
    from kubernetes import client

    selector = _POD_SELECTOR[job.kind].format(name=job.name)
    return list(client.CoreV1Api(api).list_namespaced_pod(job.namespace, label_selector=selector).items)


def _reason(exc: Any) -> str:
    """The API server's message, never the request (which may carry a bearer token)."""
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"HTTP {exc.status} {exc.reason}"
