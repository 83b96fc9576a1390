"""``hpcpipe launch k8s``: Kubeflow manifests for a job, validated before they are written.

Two APIs, because neither covers everything (November 2026):

- **TrainJob** (Kubeflow Trainer v2, ``trainer.kubeflow.org/v1alpha1``), the default. It runs on a
  ClusterTrainingRuntime (``torch-distributed`` ships with Trainer); per-job volumes, mounts and
  scheduling go in a ``runtimePatches`` entry, the only place v2 accepts them. v2 has no elastic
  policy yet. ``--runtime`` also renders ``hpcpipe-torch``, a runtime whose JobSet restarts the
  job after a preemption (exit 75) at most ``max_restarts`` times and stages data in an init step.
- **PyTorchJob** (Training Operator v1, ``kubeflow.org/v1``) for elastic jobs
  (``parallel.nnodes MIN:MAX``): ``elasticPolicy`` with the c10d rendezvous. Its restart policy is
  ``OnFailure``: with ``ExitCode``, v1 treats exit codes 1-127 as permanent, so a preempted
  worker (exit 75) would end the job instead of resuming it.

Every document is checked against the operators' published models (``k8s_validate``) first.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from pathlib import PurePosixPath
from typing import Any, Literal

import yaml

from hpcpipe.config import JobConfig
from hpcpipe.config.launch import check_plain_env
from hpcpipe.errors import ConfigError
from hpcpipe.launch.job import check_node_range
from hpcpipe.launch.k8s_pod import (
    CONFIG_FILE,
    NODE_CONTAINER,
    STAGE_CONTAINER,
    PodParts,
    config_map,
    pod_parts,
    processes_per_node,
)
from hpcpipe.launch.k8s_validate import validate_manifest
from hpcpipe.recipes.registry import recipe_label
from hpcpipe.yamlfile import SafeDumper

Api = Literal["trainjob", "pytorchjob"]
APIS: tuple[str, ...] = ("trainjob", "pytorchjob")
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
HPCPIPE_RUNTIME = "hpcpipe-torch"
PATCH_MANAGER = "hpcpipe.dev/launch"
PYTORCHJOB_CONTAINER = "pytorch"  # the container the v1 operator gives PET_* and watches
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_MAX_NAME = 40  # pods are named <job>-node-<i>-<j>-<suffix>; 63 characters in all
_NAME_HASH = 6  # hex digits of the hash that ends a name dns_label had to rewrite
# The run (a hash of its run directory) a job, its ConfigMap and pods belong to: `hpcpipe run --on
# k8s` deletes a job under its name only when it carries this run's value.
RUN_LABEL = "hpcpipe.dev/run"
# A TrainJob's rendezvous port: Kubeflow Trainer sets PET_MASTER_PORT to its ContainerTrainerPort,
# whatever launch.k8s.rdzv_port says (the PyTorchJob's elasticPolicy.rdzvPort).
TRAINJOB_RDZV_PORT = 29500


def render_k8s(
    job: JobConfig, api: Api = "trainjob", with_runtime: bool = False, name: str | None = None
) -> list[dict[str, Any]]:
    """The ConfigMap and the job (and the hpcpipe runtime when asked), each validated; named
    ``name`` (the job a run directory recorded: ``k8s_train``) or else ``job_name``."""
    if api not in APIS:
        raise ConfigError(f"--api {api}: use trainjob or pytorchjob")
    check_plain_env(job.launch)  # launch k8s, run --on k8s, helm-values, kfp, katib all render here
    name = name or job_name(job)
    runtime = HPCPIPE_RUNTIME if with_runtime else job.launch.k8s.runtime
    _check(job, api, runtime, with_runtime)
    parts = pod_parts(job, name)
    labels = _labels(job, name)
    docs = [config_map(job, name, labels)]
    if api == "trainjob":
        if with_runtime:
            docs.append(training_runtime(job, parts))
        docs.append(train_job(job, name, parts, labels, runtime))
    else:
        docs.append(pytorch_job(job, name, parts, labels))
    for doc in docs:
        validate_manifest(doc)
    return docs


class _PlainDumper(SafeDumper):
    """No &anchors/*aliases for shared dicts: kubectl accepts them, reviewers should not need to."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _block_strings(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None  # the ConfigMap's config.yaml stays readable
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_PlainDumper.add_representer(str, _block_strings)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False, width=120)


def job_name(job: JobConfig) -> str:
    """``launch.k8s.name`` as given (checked), else ``run.name`` made into a DNS label."""
    given = job.launch.k8s.name
    if given is not None:
        if not is_job_name(given):
            raise ConfigError(
                f"launch.k8s.name {given!r}: use lower-case letters, digits and '-', starting with a "
                f"letter, at most {_MAX_NAME} characters"
            )
        return given
    return dns_label(job.run.name)


def is_job_name(text: str) -> bool:
    """Whether ``text`` can name a job: a DNS label of at most 40 characters."""
    return bool(_DNS_LABEL.fullmatch(text)) and len(text) <= _MAX_NAME


def dns_label(text: str) -> str:
    """``text`` as a DNS label of at most 40 characters that starts with a letter: as it is when it
    is one, else rewritten and ended by a hash of ``text``, so that names that differ only where
    they were cut or rewritten (``...-seed0`` and ``...-seed1`` past 40 characters; ``exp_1``,
    ``exp.1`` and ``Exp-1``) stay two names, not one job's."""
    if is_job_name(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:_NAME_HASH]
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"hpcpipe-{name}"
    return f"{name[: _MAX_NAME - _NAME_HASH - 1].rstrip('-')}-{digest}"


def run_label(job: JobConfig) -> str:
    """The value of ``RUN_LABEL``: ``place_label`` of the run directory, the run that owns the job
    (a Kubernetes label value holds no path)."""
    cfg = job.launch.k8s
    return place_label(
        cfg.namespace, run_claim(cfg.runs_pvc, cfg.checkpoint_pvc), job.run.out_dir, job.run.name
    )


def run_claim(runs_pvc: str | None, checkpoint_pvc: str | None) -> str | None:
    """The claim the run directories lie on (``_check_claims``: run.out_dir is under its mount);
    None where they lie on the pods' own disks."""
    return runs_pvc or checkpoint_pvc


def place_label(namespace: str, claim: str | None, out_dir: str, name: str) -> str:
    """A hash of where a run directory lies: the namespace, the claim it is on, its path there. The
    path alone named two runs as one: the same run.out_dir on two teams' claims."""
    run_dir = posixpath.normpath(posixpath.join(out_dir, name))
    place = json.dumps([namespace, claim or "", run_dir])
    return hashlib.sha256(place.encode()).hexdigest()[:16]


def _check(job: JobConfig, api: Api, runtime: str, with_runtime: bool) -> None:
    cfg = job.launch.k8s
    low, high = job.parallel.node_range
    if api == "trainjob" and low != high:
        raise ConfigError(
            f"parallel.nnodes {job.parallel.nnodes}: TrainJob (Kubeflow Trainer v2) has no elastic "
            "policy yet; use --api pytorchjob for MIN:MAX nodes"
        )
    if api == "trainjob" and cfg.priority_class and runtime != HPCPIPE_RUNTIME:
        raise ConfigError(
            f"launch.k8s.priority_class: a TrainJob cannot set it on the {runtime} runtime; "
            f"use launch.k8s.runtime={HPCPIPE_RUNTIME} (render it with --runtime) or --api pytorchjob"
        )
    if with_runtime and api != "trainjob":
        raise ConfigError("--runtime renders a ClusterTrainingRuntime: it goes with --api trainjob")
    if api == "trainjob" and cfg.rdzv_port != type(cfg).model_fields["rdzv_port"].default:
        raise ConfigError(
            f"launch.k8s.rdzv_port {cfg.rdzv_port}: a TrainJob rendezvouses on Kubeflow Trainer's port "
            f"{TRAINJOB_RDZV_PORT}, which it cannot change; rdzv_port is for --api pytorchjob"
        )
    check_node_range(job, processes_per_node(cfg))
    _check_metrics(job, api, runtime)
    _check_claims(job)


def _check_claims(job: JobConfig) -> None:
    """The run directory lies on its claim (runs_pvc, else checkpoint_pvc), and a checkpoints
    claim beside a runs claim has a checkpoint tier pointing at it."""
    cfg = job.launch.k8s
    if cfg.runs_pvc and not under_mount(job.run.out_dir, cfg.runs_mount):
        raise ConfigError(
            f"run.out_dir {job.run.out_dir!r} is not under launch.k8s.runs_mount {cfg.runs_mount!r}: "
            f"run directories would not reach the claim {cfg.runs_pvc}"
        )
    if cfg.checkpoint_pvc and not cfg.runs_pvc and not under_mount(job.run.out_dir, cfg.checkpoint_mount):
        raise ConfigError(
            f"run.out_dir {job.run.out_dir!r} is not under launch.k8s.checkpoint_mount "
            f"{cfg.checkpoint_mount!r}: checkpoints would not reach the claim {cfg.checkpoint_pvc}"
        )
    _check_tiers_on_claims(job)
    tiers = [t for t in (job.checkpoint.dir, job.checkpoint.durable_dir) if t]
    if cfg.checkpoint_pvc and cfg.runs_pvc and not any(under_mount(t, cfg.checkpoint_mount) for t in tiers):
        raise ConfigError(
            f"launch.k8s.checkpoint_pvc {cfg.checkpoint_pvc}: with launch.k8s.runs_pvc the checkpoints "
            f"stay in the run directory; point checkpoint.durable_dir (or checkpoint.dir) under "
            f"{cfg.checkpoint_mount}"
        )


def _check_metrics(job: JobConfig, api: Api, runtime: str) -> None:
    """An exporter in a pod must be reachable, and its ports declared (Prometheus discovers a
    pod's targets from its declared container ports)."""
    prom = job.observe.prometheus
    if prom.port is None:
        return
    if prom.host in ("127.0.0.1", "localhost", "::1"):
        raise ConfigError(
            f"observe.prometheus.host {prom.host}: Prometheus cannot reach a pod's loopback; "
            "set observe.prometheus.host=0.0.0.0 for Kubernetes"
        )
    if api == "trainjob" and runtime != HPCPIPE_RUNTIME:
        raise ConfigError(
            f"observe.prometheus.port: a TrainJob cannot declare container ports on the {runtime} "
            f"runtime; use launch.k8s.runtime={HPCPIPE_RUNTIME} (render it with --runtime) or "
            "--api pytorchjob"
        )
    ports = range(prom.port, prom.port + processes_per_node(job.launch.k8s))  # one per local rank
    rdzv = TRAINJOB_RDZV_PORT if api == "trainjob" else job.launch.k8s.rdzv_port
    if rdzv in ports:
        raise ConfigError(
            f"observe.prometheus.port {prom.port}: the exporters' ports {ports.start}-{ports.stop - 1} "
            f"(one per local rank) include the c10d rendezvous port {rdzv}; choose ports apart from it"
        )


def runtime_note(job: JobConfig, api: str, with_runtime: bool) -> str | None:
    """What a TrainJob on ``hpcpipe-torch`` rendered without its runtime leaves to the runtime the
    cluster has: the stage init step's image and command (a TrainJob's container patch cannot set
    an image), and the priority class and the metrics ports (Trainer v2's runtime patches cannot
    set them), so this job's values take effect only where that runtime has them."""
    cfg = job.launch.k8s
    if api != "trainjob" or with_runtime or cfg.runtime != HPCPIPE_RUNTIME:
        return None
    settings = {
        "launch.k8s.priority_class": cfg.priority_class,
        "observe.prometheus.port": job.observe.prometheus.port,
    }
    kept = [key for key, value in settings.items() if value is not None]
    verb = "apply only as that runtime has them" if len(kept) > 1 else "applies only as that runtime has it"
    also = f"; {' and '.join(kept)} {verb}" if kept else ""
    return (
        f"note: on the cluster's {HPCPIPE_RUNTIME} runtime the {STAGE_CONTAINER} init step runs the image "
        "and command the runtime was installed with, not launch.k8s.image and launch.k8s.hpcpipe (a "
        f"TrainJob cannot set them){also}; --runtime renders the runtime from this job"
    )


def _check_tiers_on_claims(job: JobConfig) -> None:
    """Where the job mounts claims, a checkpoint tier set outside them is on the pod's own disk:
    gone with the pod, and unseen by the other nodes' ranks. The fast tier may stay there only
    on one node with a durable tier on a claim (what a recreated pod resumes from)."""
    cfg = job.launch.k8s
    mounts = [
        m for pvc, m in ((cfg.runs_pvc, cfg.runs_mount), (cfg.checkpoint_pvc, cfg.checkpoint_mount)) if pvc
    ]
    if not mounts:
        return
    tiers = {"checkpoint.durable_dir": job.checkpoint.durable_dir, "checkpoint.dir": job.checkpoint.dir}
    off = {k: path for k, path in tiers.items() if path and not any(under_mount(path, m) for m in mounts)}
    if job.parallel.node_range[1] == 1 and job.checkpoint.durable_dir and "checkpoint.durable_dir" not in off:
        off.pop("checkpoint.dir", None)  # one node: a fast tier on its disk, the durable one on a claim
    for key, path in off.items():
        raise ConfigError(
            f"{key} {path!r} is on each pod's own disk (no claim is mounted there): put it under "
            f"{' or '.join(mounts)}, or leave it null"
        )


def under_mount(path: str, mount: str) -> bool:
    """``path`` lies under ``mount`` once normalised (``/checkpoints/../tmp`` does not)."""
    return PurePosixPath(posixpath.normpath(path)).is_relative_to(PurePosixPath(posixpath.normpath(mount)))


def _labels(job: JobConfig, name: str) -> dict[str, str]:
    cfg = job.launch.k8s
    labels = {
        "app.kubernetes.io/name": "hpcpipe",
        "app.kubernetes.io/instance": name,
        "hpcpipe.dev/recipe": recipe_label(job.run.recipe),  # a label value: the recipe's name
        RUN_LABEL: run_label(job),
    }
    if cfg.queue:
        labels["kueue.x-k8s.io/queue-name"] = cfg.queue
    if layout := layout_label(job):
        labels["hpcpipe.dev/layout"] = layout
    return labels | cfg.labels


def layout_label(job: JobConfig) -> str | None:
    """``pp<p>-dp<d>-tp<t>`` at the most nodes (tensor parallel inside a pod); None without tensor
    or pipeline parallelism. The chart's ``layout`` value (``launch helm-values``)."""
    world = job.parallel.node_range[1] * processes_per_node(job.launch.k8s)
    layout = job.parallel.layout_at(world)
    return None if layout is None else "pp{}-dp{}-tp{}".format(*layout)


def _scheduling(job: JobConfig) -> dict[str, Any]:
    """Pod-spec fields for placement, in Kubernetes' own spelling."""
    cfg = job.launch.k8s
    fields: dict[str, Any] = {}
    if cfg.node_selector:
        fields["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        fields["tolerations"] = [dict(t) for t in cfg.tolerations]
    if cfg.service_account:
        fields["serviceAccountName"] = cfg.service_account
    if cfg.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": name} for name in cfg.image_pull_secrets]
    return fields


def _pod_metadata(job: JobConfig, labels: dict[str, str]) -> dict[str, Any]:
    # Kueue admits the job by its queue label; the pods need not repeat it.
    meta: dict[str, Any] = {
        "labels": {k: v for k, v in labels.items() if not k.startswith("kueue.x-k8s.io/")}
    }
    if job.launch.k8s.annotations:
        meta["annotations"] = dict(job.launch.k8s.annotations)
    return meta


# -- Kubeflow Trainer v2 -----------------------------------------------------------------------


def train_job(
    job: JobConfig, name: str, parts: PodParts, labels: dict[str, str], runtime: str
) -> dict[str, Any]:
    cfg = job.launch.k8s
    pod_spec: dict[str, Any] = {
        "volumes": parts.volumes,
        "containers": [{"name": NODE_CONTAINER, "volumeMounts": parts.mounts}],
    }
    pod_spec["terminationGracePeriodSeconds"] = job.fault.pod_grace_s  # the preemption checkpoint
    if runtime == HPCPIPE_RUNTIME:  # its stage step reads the config (and the cache) too
        pod_spec["initContainers"] = [{"name": STAGE_CONTAINER, "volumeMounts": parts.mounts}]
    # On torch-distributed (no init step to patch in) the agent stages while preparing its inputs.
    pod_spec |= _scheduling(job)
    pod_patch = {"metadata": _pod_metadata(job, labels), "spec": pod_spec}
    patch = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod_patch}}}]}
            }
        },
    }
    trainer: dict[str, Any] = {
        "image": parts.image,
        "command": parts.command,
        "env": parts.env,
        "numNodes": job.parallel.node_range[1],
        "numProcPerNode": processes_per_node(cfg),
    }
    if parts.resources:
        trainer["resourcesPerNode"] = parts.resources
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {
            "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntime", "name": runtime},
            "trainer": trainer,
            "runtimePatches": [patch],
        },
    }


def training_runtime(job: JobConfig, parts: PodParts) -> dict[str, Any]:
    """``hpcpipe-torch``: torch-distributed plus a stage init step and bounded preemption restarts.

    A worker that exits 75 (checkpointed after SIGTERM), or a stage step that does (evicted),
    fails its Job through the pod failure policy (reason PodFailurePolicy); the JobSet restarts
    on that reason only, at most ``max_restarts`` times, and fails at once on anything else.
    """
    cfg = job.launch.k8s
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a pod failure policy needs it
        # Each TrainJob sets its own image and command (with its rendezvous id) over these.
        "containers": [{"name": NODE_CONTAINER, "image": parts.image, "command": parts.command[:4]}],
        "initContainers": [
            {
                "name": STAGE_CONTAINER,
                "image": parts.image,
                "command": [cfg.hpcpipe, "data", "stage", "--job", CONFIG_FILE, "--if-configured"],
            }
        ],
    }
    if parts.metrics_ports:
        pod_spec["containers"][0]["ports"] = parts.metrics_ports
    if cfg.priority_class:
        pod_spec["priorityClassName"] = cfg.priority_class
    code = job.fault.preempt_exit_code
    # The stage step exits with that code too when its pod is evicted (data stage's SIGTERM).
    exit_rules = [
        {"action": "FailJob", "onExitCodes": {"containerName": name, "operator": "In", "values": [code]}}
        for name in (NODE_CONTAINER, STAGE_CONTAINER)
    ]
    node_job = {
        "name": "node",
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": exit_rules},
                "template": {"spec": pod_spec},
            },
        },
    }
    failure_policy = {
        "maxRestarts": cfg.max_restarts,
        "rules": [
            {"name": "Preempted", "action": "RestartJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
            {"name": "Failed", "action": "FailJobSet"},
        ],
    }
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": HPCPIPE_RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"failurePolicy": failure_policy, "replicatedJobs": [node_job]}},
        },
    }


# -- Training Operator v1 ----------------------------------------------------------------------


def pytorch_job(job: JobConfig, name: str, parts: PodParts, labels: dict[str, str]) -> dict[str, Any]:
    cfg = job.launch.k8s
    low, high = job.parallel.node_range
    container: dict[str, Any] = {
        "name": PYTORCHJOB_CONTAINER,
        "image": parts.image,
        "command": parts.command,
        "env": parts.env,
        "volumeMounts": parts.mounts,
        "ports": [{"name": "c10d", "containerPort": cfg.rdzv_port}, *parts.metrics_ports],
    }
    if parts.resources:
        container["resources"] = parts.resources
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": parts.volumes,
        "terminationGracePeriodSeconds": job.fault.pod_grace_s,  # the preemption checkpoint
    }
    if parts.stage is not None:
        pod_spec["initContainers"] = [parts.stage]
    if cfg.priority_class:
        pod_spec["priorityClassName"] = cfg.priority_class
    pod_spec |= _scheduling(job)
    worker = {
        "replicas": high,
        "restartPolicy": "OnFailure",  # not ExitCode: that makes exit 75 (preempted) permanent
        "template": {"metadata": _pod_metadata(job, labels), "spec": pod_spec},
    }
    elastic = {
        "rdzvBackend": "c10d",
        "rdzvPort": cfg.rdzv_port,
        "minReplicas": low,
        "maxReplicas": high,
        "maxRestarts": cfg.max_restarts,
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels},
        "spec": {
            "elasticPolicy": elastic,
            "nprocPerNode": str(processes_per_node(cfg)),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": cfg.max_restarts},
            "pytorchReplicaSpecs": {"Worker": worker},
        },
    }
