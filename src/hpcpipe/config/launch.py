"""The ``launch`` section of a job: what the Slurm and Kubernetes launchers render."""

from __future__ import annotations

import itertools
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from hpcpipe.config.section import Section, one_line
from hpcpipe.errors import ConfigError

_SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|(?i:unlimited|infinite)")
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Kubernetes' own rules (apimachinery), checked here so a rendered manifest is not refused by the
# API server: a resource quantity (no sign: an amount), a DNS-1123 label and subdomain, a label
# value, and a Secret's key.
_QUANTITY = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(?=.{0,63}$)([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
# A label/annotation key or resource name: an optional DNS-subdomain prefix and '/', then a name
# of at most 63 characters that starts and ends alphanumeric.
_QUALIFIED_NAME = re.compile(
    r"((?=[^/]{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(?=[^/]{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
# Parts of an environment name that say its value is a secret (API_KEY as its two parts joined).
_SECRET_PARTS = frozenset({"TOKEN", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "APIKEY"})
# A last part that says the value is where a secret lies (HF_TOKEN_PATH, AWS_WEB_IDENTITY_TOKEN_FILE),
# and a part that says it switches one off (HF_HUB_DISABLE_IMPLICIT_TOKEN): no secret either way.
_PLACE_PARTS = frozenset({"FILE", "PATH", "DIR"})
_SWITCH_PARTS = frozenset({"DISABLE"})
_SLURM_INSTEAD = "export it in the shell you submit from instead (sbatch passes that environment on)"
_K8S_INSTEAD = "give it in launch.k8s.secret_env as NAME: 'secret-name/key' instead"
TYPED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")  # set by cpu, memory and gpus_per_node
# launch/kubernetes.py sets them: the first two select a job's pods, the third names its run.
OWN_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "hpcpipe.dev/run")


def looks_secret(name: str) -> bool:
    """Whether an environment name says it holds a secret: one of ``_SECRET_PARTS`` as a part of it,
    any case (HF_TOKEN, WANDB_API_KEY, db.password; not TOKENIZERS_PARALLELISM, nor a path to one,
    GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN_PATH, nor a switch, HF_HUB_DISABLE_IMPLICIT_TOKEN)."""
    parts = [part.upper() for part in re.split(r"[-_.]+", name) if part]
    if not parts or parts[-1] in _PLACE_PARTS or not _SWITCH_PARTS.isdisjoint(parts):
        return False
    pairs = {a + b for a, b in itertools.pairwise(parts)}
    return not _SECRET_PARTS.isdisjoint({*parts, *pairs})


def check_plain_env(launch: LaunchConfig, stored: LaunchConfig | None = None) -> None:
    """ConfigError when ``launch.slurm.env`` or ``launch.k8s.env`` names a secret. Both, whichever
    scheduler renders: config.yaml, the sbatch script's neighbour, a manifest's ConfigMap and a
    pipeline's config parameter carry the whole config, and the tracked params flatten it.
    Checked where a new run or a submission starts and where a job is rendered, not when a config
    loads: a run's stored config.yaml (a requeued job's, or one from before this check) still
    loads for its workers, track, eval and report. ``stored``: that run's launch section, when the
    run is resumed from it; the names it already holds pass."""
    sections = (
        ("slurm", launch.slurm.env, stored.slurm.env if stored else {}, _SLURM_INSTEAD),
        ("k8s", launch.k8s.env, stored.k8s.env if stored else {}, _K8S_INSTEAD),
    )
    for scheduler, env, known, instead in sections:
        for name in env:
            if looks_secret(name) and name not in known:
                raise ConfigError(
                    f"launch.{scheduler}.env: {name} looks like a secret, and a value here is plain "
                    f"text in config.yaml, the sbatch script or manifest, and the tracked params: {instead}"
                )


class SlurmConfig(Section):
    """``hpcpipe launch slurm``: what the rendered sbatch script asks for and sets up."""

    partition: str | None = Field(None, description="#SBATCH --partition (null: the cluster's default).")
    account: str | None = Field(None, description="#SBATCH --account.")
    qos: str | None = Field(None, description="#SBATCH --qos.")
    constraint: str | None = Field(None, description="#SBATCH --constraint (node features).")
    time: str = Field("01:00:00", description="#SBATCH --time, [D-]HH:MM:SS.")
    gpus_per_node: int = Field(
        0, ge=0, description="#SBATCH --gpus-per-node; also the processes per node when > 0."
    )
    cpus_per_task: int | None = Field(
        None, ge=1, description="#SBATCH --cpus-per-task: cores for the node's agent and all its workers."
    )
    mem: str | None = Field(None, description="#SBATCH --mem per node, e.g. 200G (null: the default).")
    exclusive: bool = Field(False, description="#SBATCH --exclusive: no other job on the nodes.")
    signal: str = Field(
        "USR1",
        description="Signal Slurm sends every task signal_grace_s before the time limit "
        "(#SBATCH --signal=<signal>@<grace>, without B:, which would reach only the batch shell).",
    )
    signal_grace_s: int = Field(
        120, ge=10, description="Seconds before the time limit that the signal is sent."
    )
    max_requeues: int = Field(
        3,
        ge=0,
        description="Requeue a preempted job (exit 75) at most this many times "
        "(SLURM_RESTART_COUNT), and only while its newest checkpoint advances.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Exported in the script before the job starts: NCCL_*, GLOO_SOCKET_IFNAME, "
        "NCCL_IB_HCA, ... (values only, no secrets: those come from the cluster's environment; a name "
        "with TOKEN, PASSWORD, SECRET, API_KEY or CREDENTIAL in it is refused when a run or a "
        "submission starts and when a script or manifest is rendered, unless it ends in _FILE, _PATH "
        "or _DIR or has a DISABLE part).",
    )
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines run before the job (module load ..., source venv/bin/activate).",
    )
    hpcpipe: str = Field(
        "hpcpipe",
        min_length=1,
        description="The command that runs hpcpipe on the nodes (e.g. /opt/venv/bin/hpcpipe).",
    )
    container: str | None = Field(
        None,
        min_length=1,
        description="Apptainer image (.sif) to run hpcpipe in on the nodes (`apptainer exec`, with "
        "--nv when gpus_per_node > 0); sbatch, srun and scontrol stay outside it. null: no container.",
    )
    container_binds: list[str] = Field(
        default_factory=list,
        description="apptainer --bind paths (src[:dest]) the runs need: scratch, datasets, the node cache.",
    )
    rdzv_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="c10d rendezvous port on the first node (null: 20000 + job id mod 20000, so "
        "jobs sharing a node do not collide).",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="Elastic agent: times the worker group is restarted after a failure or a "
        "membership change within one allocation.",
    )

    @field_validator("partition", "account", "qos", "constraint", "time", "mem")
    @classmethod
    def _one_sbatch_word(cls, value: str | None) -> str | None:
        # Each becomes an `#SBATCH --key=value` line: a newline would add lines to the script.
        if value is not None and any(c.isspace() or not c.isprintable() for c in value):
            raise ValueError("must be one word without spaces or control characters")
        return value

    @field_validator("time")
    @classmethod
    def _a_slurm_time(cls, value: str) -> str:
        # Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time).
        if not _SLURM_TIME.fullmatch(value):
            raise ValueError("use [D-]HH:MM:SS (or Slurm's MM, MM:SS, D-HH, D-HH:MM, UNLIMITED)")
        return value

    @field_validator("env")
    @classmethod
    def _shell_variable_names(cls, env: dict[str, str]) -> dict[str, str]:
        # Each key becomes `export KEY=...` in the script: only a shell variable name is one.
        for key in env:
            if not _SHELL_NAME.fullmatch(key):
                raise ValueError(
                    f"{key!r} is not a shell variable name (letters, digits, _; not a digit first)"
                )
        return env

    @field_validator("signal")
    @classmethod
    def _a_signal_every_task_gets(cls, value: str) -> str:
        if value.startswith("B:"):
            raise ValueError(
                "'B:' sends the signal only to the batch shell, never to the training "
                "processes; give the bare name (USR1)"
            )
        name = value.removeprefix("SIG")
        if name not in ("USR1", "TERM"):
            raise ValueError("use USR1 or TERM: the signals hpcpipe's workers checkpoint on")
        return name

    _one_line = field_validator("hpcpipe", "container", "partition", "account", "qos", "constraint")(one_line)


class K8sConfig(Section):
    """``hpcpipe launch k8s``: what the rendered Kubeflow manifests ask for and mount.

    Nodes come from ``parallel.nnodes`` (``MIN:MAX`` needs the elastic PyTorchJob API)."""

    namespace: str = Field("default", description="Namespace of the job and its ConfigMap.")
    name: str | None = Field(
        None,
        description="Job name (null: run.name as a DNS label, ended by a hash of run.name where it "
        "had to be cut or rewritten; run --on k8s keeps the name the run directory recorded).",
    )
    image: str = Field(
        "ghcr.io/hpcpipe/hpcpipe:latest",
        min_length=1,
        description="Container image with hpcpipe installed (containers/Dockerfile).",
    )
    image_digest: str | None = Field(
        None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="Pin the image by digest (sha256:...): rendered as image@digest, so every node "
        "runs the same bytes.",
    )
    gpus_per_node: int = Field(
        0, ge=0, description="nvidia.com/gpu per node; also the processes per node when > 0."
    )
    nproc_per_node: int | None = Field(
        None, ge=1, description="Processes per node (null: gpus_per_node, or 1 without GPUs)."
    )
    cpu: str | None = Field(None, description="CPU request and limit per node (e.g. '32').")
    memory: str | None = Field(None, description="Memory request and limit per node (e.g. '200Gi').")
    shm_size: str = Field(
        "16Gi",
        description="Size of the in-memory /dev/shm (DataLoader workers and NCCL need more than 64 Mi).",
    )
    extra_resources: dict[str, int] = Field(
        default_factory=dict,
        description="More resources per node, e.g. {'rdma/ib': 1} or {'nvidia.com/hostdev': 8} for RDMA.",
    )
    data_pvc: str | None = Field(
        None, description="PersistentVolumeClaim (ReadWriteMany) with the datasets, mounted at data_mount."
    )
    data_mount: str = Field("/data", min_length=1, description="Where data_pvc is mounted.")
    checkpoint_pvc: str | None = Field(
        None,
        description="PersistentVolumeClaim (ReadWriteMany) for checkpoints, mounted at checkpoint_mount. "
        "Without runs_pvc it holds the run directories too: set run.out_dir under it. With runs_pvc, "
        "point checkpoint.durable_dir (or checkpoint.dir) under it.",
    )
    checkpoint_mount: str = Field(
        "/checkpoints", min_length=1, description="Where checkpoint_pvc is mounted."
    )
    runs_pvc: str | None = Field(
        None,
        description="PersistentVolumeClaim (ReadWriteMany) for run directories (metrics, logs, lineage, "
        "reports), mounted at runs_mount; set run.out_dir under it. Null: they go on checkpoint_pvc.",
    )
    runs_mount: str = Field("/runs", min_length=1, description="Where runs_pvc is mounted.")
    cache_host_path: str | None = Field(
        None,
        min_length=1,
        description="Node-local disk (hostPath, e.g. /mnt/nvme/hpcpipe-cache) mounted at data.cache_dir; "
        "an init step stages the dataset there by hash. null: no staging.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Plain environment: NCCL_*, NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ... (never secrets: "
        "a name with TOKEN, PASSWORD, SECRET, API_KEY or CREDENTIAL in it is refused when a run or a "
        "submission starts and when a script or manifest is rendered, unless it ends in _FILE, _PATH "
        "or _DIR or has a DISABLE part; see secret_env).",
    )
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment from Kubernetes Secrets, NAME: 'secret-name/key' (rendered as "
        "secretKeyRef; the value never appears in the manifest).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Pod annotations (e.g. a Multus network for RDMA)."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels on the job and its pods.")
    queue: str | None = Field(None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
    priority_class: str | None = Field(None, description="PriorityClass of the pods.")
    service_account: str | None = Field(None, description="ServiceAccount of the pods.")
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets (kubernetes.io/dockerconfigjson) the pods pull the image with: a private "
        "registry. Names only; the Secrets live in the job's namespace.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Pod tolerations, as Kubernetes writes them ({key, operator, value, effect}).",
    )
    runtime: str = Field(
        "torch-distributed",
        description="TrainJob: the ClusterTrainingRuntime to run on (torch-distributed ships with "
        "Kubeflow Trainer; 'hpcpipe-torch' is the one `launch k8s --runtime` renders).",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="PyTorchJob: elasticPolicy.maxRestarts. hpcpipe-torch runtime: JobSet restarts "
        "after a preemption (exit 75).",
    )
    rdzv_port: int = Field(
        29400,
        ge=1024,
        le=65535,
        description="PyTorchJob: c10d rendezvous port. A TrainJob's is Kubeflow Trainer's own (29500): "
        "another value is refused there.",
    )
    hpcpipe: str = Field("hpcpipe", min_length=1, description="The hpcpipe command inside the image.")

    @field_validator("secret_env")
    @classmethod
    def _secret_refs(cls, value: dict[str, str]) -> dict[str, str]:
        for name, ref in value.items():
            secret, _, key = ref.partition("/")
            if not secret or not key or "/" in key:
                raise ValueError(f"{name}: give 'secret-name/key', not a value")
            if not _DNS_SUBDOMAIN.fullmatch(secret) or not _SECRET_KEY.fullmatch(key):
                raise ValueError(
                    f"{name}: {ref!r} is not a Secret's name/key (a lower-case DNS name, then "
                    "letters, digits, '-', '_' or '.')"
                )
        return value

    @field_validator("labels")
    @classmethod
    def _not_hpcpipes_own(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key in OWN_LABELS:  # the PodMonitor and `hpcpipe jobs` find the pods by them
                raise ValueError(
                    f"{key!r} is set by hpcpipe (it selects the job's pods or names its run); use another key"
                )
        return value

    @field_validator("labels", "node_selector")
    @classmethod
    def _label_pairs(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            _check_qualified_name(key)
            if not _LABEL_VALUE.fullmatch(item):
                raise ValueError(
                    f"{key}: {item!r} is not a label value (at most 63 letters, digits, '-', '_' or '.', "
                    "starting and ending with a letter or digit)"
                )
        return value

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            _check_qualified_name(key)
        return value

    @field_validator("env", "secret_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, '_-.')")
        return value

    @field_validator("extra_resources")
    @classmethod
    def _extra_resources(cls, value: dict[str, int]) -> dict[str, int]:
        for name, amount in value.items():
            if name in TYPED_RESOURCES:
                raise ValueError(f"{name!r} has its own key (cpu, memory, gpus_per_node); set it there")
            _check_qualified_name(name)
            if amount < 1:
                raise ValueError(f"{name}: {amount} is not an amount (at least 1)")
        return value

    @field_validator("data_pvc", "checkpoint_pvc", "runs_pvc", "service_account", "priority_class")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(f"{value!r} is not an object name (lower-case letters, digits, '-' and '.')")
        return value

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _DNS_SUBDOMAIN.fullmatch(name):
                raise ValueError(f"{name!r} is not a Secret's name (lower-case letters, digits, '-' and '.')")
        return value

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.fullmatch(value):
            raise ValueError("not a Kubernetes quantity (e.g. 32, 500m, 200Gi, 16G)")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.fullmatch(value):
            raise ValueError("a namespace is a DNS label (a-z, 0-9 and '-', at most 63)")
        return value

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str | None) -> str | None:
        if value is not None and not (value and _LABEL_VALUE.fullmatch(value)):
            raise ValueError("a queue name is a label value (letters, digits, '-', '_', '.')")
        return value

    @field_validator("data_mount", "checkpoint_mount", "runs_mount")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("a mount path is absolute")
        return value

    @model_validator(mode="after")
    def _a_gpu_per_process(self) -> K8sConfig:
        if self.gpus_per_node and self.nproc_per_node and self.nproc_per_node > self.gpus_per_node:
            raise ValueError(
                f"nproc_per_node {self.nproc_per_node} is more than gpus_per_node {self.gpus_per_node}: "
                "ranks would share a GPU (NCCL refuses: 'Duplicate GPU detected')"
            )
        return self


def _check_qualified_name(key: str) -> None:
    if not _QUALIFIED_NAME.fullmatch(key):
        raise ValueError(
            f"{key!r} is not a Kubernetes key ([prefix/]name: a DNS prefix, then at most 63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )


class LaunchConfig(Section):
    """How `hpcpipe launch` renders and submits the job: Slurm and Kubernetes settings."""

    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    k8s: K8sConfig = Field(default_factory=K8sConfig)
