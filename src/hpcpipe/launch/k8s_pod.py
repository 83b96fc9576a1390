"""The pod-level pieces every hpcpipe manifest shares, built with the ``kubernetes`` client's models.

Both APIs run the same pod: one container ``node`` per node that starts ``hpcpipe launch agent``
(it reads the operator's ``PET_*`` variables the way torchrun does), the job's config from a
ConfigMap, a RAM-backed ``/dev/shm``, optional claims for data and checkpoints, and a hostPath on
the node's local disk that ``hpcpipe data stage`` fills by hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from hpcpipe.config import JobConfig
from hpcpipe.config.launch import K8sConfig
from hpcpipe.errors import ConfigError
from hpcpipe.layout import RunLayout

CONFIG_DIR = "/etc/hpcpipe"
CONFIG_FILE = f"{CONFIG_DIR}/{RunLayout.CONFIG}"  # the ConfigMap key, mounted
NODE_CONTAINER = "node"  # the name Kubeflow Trainer's runtimes give the training container
STAGE_CONTAINER = "stage"


@dataclass(frozen=True)
class PodParts:
    """Serialized (camelCase dict) pieces, ready for either API's models."""

    image: str
    command: list[str]
    env: list[dict[str, Any]]
    resources: dict[str, Any]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    stage: dict[str, Any] | None  # the init container that stages the dataset, when configured
    metrics_ports: list[dict[str, Any]]  # metrics-<local rank>: the Prometheus exporters, if on


def pod_parts(job: JobConfig, name: str) -> PodParts:
    from kubernetes.client import ApiClient, V1Container, V1ContainerPort, V1EnvVar

    cfg = job.launch.k8s
    volumes, mounts = _volumes(job, name)
    image = image_ref(cfg)
    ser = ApiClient().sanitize_for_serialization
    stage = None
    if cfg.cache_host_path:
        stage = ser(
            V1Container(
                name=STAGE_CONTAINER,
                image=image,
                # --if-configured: data with no file manifest (a generated set) have nothing to
                # stage, as in the TrainJob runtime's init step; a failed copy still fails the pod.
                command=[cfg.hpcpipe, "data", "stage", "--job", CONFIG_FILE, "--if-configured"],
                # A copy needs no secrets and no GPU: none are given to it.
                env=[V1EnvVar(name="PYTHONUNBUFFERED", value="1")],
                volume_mounts=mounts,
                resources=_stage_resources(cfg),
            )
        )
    return PodParts(
        image=image,
        command=[
            cfg.hpcpipe,
            "launch",
            "agent",
            CONFIG_FILE,
            "--rdzv-id",
            name,
            "--grace",
            str(job.fault.agent_grace_s),
        ],
        env=ser(_env(cfg)),
        resources=ser(_resources(cfg)),
        volumes=ser(volumes),
        mounts=ser(mounts),
        stage=stage,
        metrics_ports=ser([V1ContainerPort(name=n, container_port=port) for n, port in metrics_ports(job)]),
    )


def image_ref(cfg: K8sConfig) -> str:
    """The image every pod runs: ``launch.k8s.image``, pinned as ``image@digest`` when a digest is given."""
    return f"{cfg.image.split('@')[0]}@{cfg.image_digest}" if cfg.image_digest else cfg.image


METRICS_PORT_PREFIX = "metrics-"  # deploy/k8s/podmonitor.yaml keeps the container ports named so


def metrics_ports(job: JobConfig) -> list[tuple[str, int]]:
    """(name, port) of each local rank's exporter endpoint; none without an exporter."""
    base = job.observe.prometheus.port
    if base is None:
        return []
    return [(f"{METRICS_PORT_PREFIX}{i}", base + i) for i in range(processes_per_node(job.launch.k8s))]


def processes_per_node(cfg: K8sConfig) -> int:
    return cfg.nproc_per_node or cfg.gpus_per_node or 1


def _env(cfg: K8sConfig) -> list[Any]:
    from kubernetes.client import V1EnvVar, V1EnvVarSource, V1SecretKeySelector

    env = [V1EnvVar(name="PYTHONUNBUFFERED", value="1")]
    env += [V1EnvVar(name=key, value=value) for key, value in sorted(cfg.env.items())]
    for key, ref in sorted(cfg.secret_env.items()):
        secret, _, secret_key = ref.partition("/")
        source = V1EnvVarSource(secret_key_ref=V1SecretKeySelector(name=secret, key=secret_key))
        env.append(V1EnvVar(name=key, value_from=source))
    return env


def _resources(cfg: K8sConfig) -> Any:
    from kubernetes.client import V1ResourceRequirements

    amounts: dict[str, str] = {}
    if cfg.gpus_per_node:
        amounts["nvidia.com/gpu"] = str(cfg.gpus_per_node)
    if cfg.cpu:
        amounts["cpu"] = cfg.cpu
    if cfg.memory:
        amounts["memory"] = cfg.memory
    amounts |= {key: str(value) for key, value in sorted(cfg.extra_resources.items())}
    # Requests equal limits: the Guaranteed QoS class, and what extended resources require.
    return V1ResourceRequirements(limits=amounts or None, requests=dict(amounts) or None)


def _stage_resources(cfg: K8sConfig) -> Any:
    """The node's CPU and memory, requests equal to limits, for the init container too: Kubernetes
    gives a pod the Guaranteed QoS class (exclusive CPUs under the CPU manager, NUMA alignment)
    only when every container has them, init containers included. It costs the pod nothing: an
    init container runs alone, so the pod's request is the larger of the two, the node's."""
    from kubernetes.client import V1ResourceRequirements

    amounts = {key: value for key, value in (("cpu", cfg.cpu), ("memory", cfg.memory)) if value}
    return V1ResourceRequirements(limits=amounts, requests=dict(amounts)) if amounts else None


def _volumes(job: JobConfig, name: str) -> tuple[list[Any], list[Any]]:
    from kubernetes.client import (
        V1ConfigMapVolumeSource,
        V1EmptyDirVolumeSource,
        V1HostPathVolumeSource,
        V1PersistentVolumeClaimVolumeSource,
        V1Volume,
        V1VolumeMount,
    )

    cfg = job.launch.k8s
    volumes = [
        V1Volume(name="job-config", config_map=V1ConfigMapVolumeSource(name=config_map_name(name))),
        V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(medium="Memory", size_limit=cfg.shm_size)),
    ]
    mounts = [
        V1VolumeMount(name="job-config", mount_path=CONFIG_DIR, read_only=True),
        V1VolumeMount(name="dshm", mount_path="/dev/shm"),
    ]
    for vol, claim, path in (
        ("data", cfg.data_pvc, cfg.data_mount),
        ("checkpoints", cfg.checkpoint_pvc, cfg.checkpoint_mount),
        ("runs", cfg.runs_pvc, cfg.runs_mount),
    ):
        if claim:
            volumes.append(
                V1Volume(
                    name=vol, persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(claim_name=claim)
                )
            )
            mounts.append(V1VolumeMount(name=vol, mount_path=path))
    if cfg.cache_host_path:
        cache_dir = _cache_mount(job)
        host = V1HostPathVolumeSource(path=cfg.cache_host_path, type="DirectoryOrCreate")
        volumes.append(V1Volume(name="node-cache", host_path=host))
        mounts.append(V1VolumeMount(name="node-cache", mount_path=cache_dir))
    return volumes, mounts


def _cache_mount(job: JobConfig) -> str:
    cache_dir = job.data.cache_dir
    if cache_dir is None or not PurePosixPath(cache_dir).is_absolute():
        raise ConfigError(
            "launch.k8s.cache_host_path needs data.cache_dir: the absolute path in the pod where the "
            "node's disk is mounted and the dataset is staged (e.g. /cache)"
        )
    return cache_dir


def config_map_name(name: str) -> str:
    return f"{name}-config"


def config_map(job: JobConfig, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The job's resolved config as a ConfigMap; the pods read it at ``CONFIG_FILE``."""
    from kubernetes.client import ApiClient, V1ConfigMap, V1ObjectMeta

    meta = V1ObjectMeta(name=config_map_name(name), namespace=job.launch.k8s.namespace, labels=labels)
    data = {RunLayout.CONFIG: job.to_yaml()}
    cm = V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=meta, data=data)
    return ApiClient().sanitize_for_serialization(cm)
