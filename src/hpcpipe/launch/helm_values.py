"""``hpcpipe launch helm-values``: a job's config as values of the chart in ``deploy/helm/hpcpipe``.

The chart and ``launch k8s`` render the same objects from the same settings: ``launch k8s`` builds
them in Python (no Helm needed where hpcpipe runs), the chart in Helm's templates (where a platform
team deploys). ``tests/unit/launch/test_helm_values.py`` renders both for every shipped example with the
real Helm engine and compares the job objects field by field, so neither can drift. The values
are checked exactly as ``launch k8s`` checks a job (node range, runtime rules, the operators'
models) before they are written.
"""

from __future__ import annotations

from typing import Any

from hpcpipe.config import JobConfig
from hpcpipe.launch.kubernetes import (
    HPCPIPE_RUNTIME,
    RUN_LABEL,
    Api,
    job_name,
    layout_label,
    render_k8s,
    run_label,
)
from hpcpipe.recipes.registry import recipe_label

CHART_DIR = "deploy/helm/hpcpipe"  # in a clone; `make chart` packages it as dist/hpcpipe-<version>.tgz
_DEFAULT_CACHE_HOST_PATH = "/mnt/nvme/hpcpipe-cache"


def helm_values(
    job: JobConfig, api: Api = "trainjob", with_runtime: bool = False, monitoring: bool = False
) -> dict[str, Any]:
    """The chart's values for ``job``; ConfigError (naming the key) where ``launch k8s`` would refuse it."""
    render_k8s(job, api, with_runtime)  # the same checks, and the operators' models, as launch k8s
    cfg = job.launch.k8s
    low, high = job.parallel.node_range
    repository, tag, digest = split_image(cfg.image, cfg.image_digest)
    return {
        "nameOverride": job_name(job),
        "config": job.to_yaml(),
        "recipe": recipe_label(job.run.recipe),
        "layout": layout_label(job) or "",
        "api": api,
        "runtime": {"name": HPCPIPE_RUNTIME if with_runtime else cfg.runtime, "install": with_runtime},
        "nodes": {"min": low, "max": high},
        "nprocPerNode": cfg.nproc_per_node,
        "maxRestarts": cfg.max_restarts,
        "rdzvPort": cfg.rdzv_port,
        "preemptExitCode": job.fault.preempt_exit_code,
        "preemptGraceSeconds": int(job.fault.preempt_grace_s),
        "image": {"repository": repository, "tag": tag, "digest": digest},
        "hpcpipeCommand": cfg.hpcpipe,
        "resources": {
            "gpu": {"count": cfg.gpus_per_node},
            "cpu": cfg.cpu or "",
            "memory": cfg.memory or "",
            "extra": dict(cfg.extra_resources),
        },
        "shmSize": cfg.shm_size,
        "persistence": {
            "dataset": _claim(cfg.data_pvc, cfg.data_mount),
            "checkpoints": _claim(cfg.checkpoint_pvc, cfg.checkpoint_mount),
            "runs": _claim(cfg.runs_pvc, cfg.runs_mount),
        },
        "nodeCache": {
            "enabled": cfg.cache_host_path is not None,
            "type": "hostPath",
            "mountPath": job.data.cache_dir or "/cache",
            "hostPath": cfg.cache_host_path or _DEFAULT_CACHE_HOST_PATH,
        },
        "env": dict(cfg.env),
        "secretEnv": dict(cfg.secret_env),
        # The chart merges its own labels over these; the run's is ours to set, as launch k8s does.
        "labels": dict(cfg.labels) | {RUN_LABEL: run_label(job)},
        "podAnnotations": dict(cfg.annotations),
        "queue": cfg.queue or "",
        "priorityClassName": cfg.priority_class or "",
        "serviceAccountName": cfg.service_account or "",
        "imagePullSecrets": list(cfg.image_pull_secrets),
        "nodeSelector": dict(cfg.node_selector),
        "tolerations": [dict(t) for t in cfg.tolerations],
        "metrics": {"port": job.observe.prometheus.port},
        "monitoring": {"enabled": monitoring},
    }


def split_image(image: str, digest: str | None) -> tuple[str, str, str]:
    """(repository, tag, digest) of an image reference: ``launch k8s`` writes ``image@digest``
    (an ``@digest`` already in ``image`` is replaced by ``digest`` when given)."""
    base, _, embedded = image.partition("@")
    repository, tag = base, ""
    head, sep, tail = base.rpartition(":")
    if sep and "/" not in tail:  # a tag, not a registry port (registry:5000/name)
        repository, tag = head, tail
    return repository, tag, digest or embedded


def _claim(claim: str | None, mount: str) -> dict[str, Any]:
    return {"enabled": claim is not None, "existingClaim": claim or "", "mountPath": mount}


def values_header(job: JobConfig, name: str, out: str) -> str:
    """Comment lines that open the written values file: where it came from and how to install it."""
    namespace = job.launch.k8s.namespace
    return (
        f"# Values of the hpcpipe chart for job {job.run.name} (hpcpipe launch helm-values).\n"
        f"#   helm install {name} {CHART_DIR} -n {namespace} -f {out}\n"
        "# The keys are documented in the chart's values.yaml; --set overrides any of them.\n"
    )
