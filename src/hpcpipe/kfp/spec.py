"""The spec of ``hpcpipe launch kfp``'s Kubeflow Pipelines v2 pipeline, the job's steps as containers.

The DAG is ``hpcpipe run``'s own (``pipeline.steps.STEPS``): prepare -> stage -> train ->
evaluate -> export -> register -> report, each a container step running ``hpcpipe run CONFIG
--only STEP --on k8s`` in the project image. The steps share the run directory through the
checkpoints claim, so ``lineage.json`` is written as by a local ``hpcpipe run``; each step also
hands KFP its lineage record (``--record``) as an output artifact, and takes its upstream steps'
records as input artifacts (``--upstream``, checked against the run directory), so KFP's lineage
graph shows what ``hpcpipe lineage`` shows. The train step creates the TrainJob or PyTorchJob
``launch k8s`` renders and waits for it. With ``--katib`` a Katib branch runs before train (the
Experiment ``hpo launch katib`` renders, created and waited for); its best parameters feed train.
The pipeline parameter ``tune`` switches that branch at submission. The image, claims and
environment of the steps' pods are compiled in: each step refuses a ``config`` parameter that
gives others (``check_compiled``).

The spec is plain JSON: ``kfp_compile.py`` builds the pipeline from it in kfp's own interpreter
(``sdk.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from hpcpipe.config import JobConfig, apply_values
from hpcpipe.errors import ConfigError
from hpcpipe.hpo.katib import render_experiment
from hpcpipe.launch.k8s_pod import image_ref
from hpcpipe.launch.kubernetes import Api, dns_label, render_k8s, under_mount
from hpcpipe.pipeline.steps import STEPS

CONFIG_PATH = "/tmp/hpcpipe/config.yaml"  # where each step writes the `config` pipeline parameter
# Each step's environment: the image, claims and environment compiled into its pod (JSON).
COMPILED_VAR = "HPCPIPE_KFP_COMPILED"
# KFP artifact type of each step's lineage record (system.*), for KFP's lineage view.
ARTIFACT_TYPES = {"prepare": "Dataset", "stage": "Dataset", "train": "Model", "export": "Model"}


def pipeline_spec(job: JobConfig, api: Api, katib: bool = False, katib_workers: int = 2) -> dict[str, Any]:
    """What ``kfp_compile.py`` builds the pipeline from; ConfigError naming the key where the job
    cannot run as one."""
    render_k8s(job, api)  # what the train step submits: refused now rather than in the cluster
    _check_shared_run_dir(job)
    if katib:
        _check_katib(job, katib_workers)
    cfg = job.launch.k8s
    compiled = compiled_platform(job)
    run = [cfg.hpcpipe, "run", CONFIG_PATH]
    steps = []
    tuned = False  # train and every step after it read the config with Katib's best values
    for step in STEPS:
        argv: list[Any] = [*run, "--only", step.name, "--on", "k8s", "--api", api]
        argv += ["--record", {"output": "record"}]
        for upstream in step.after:
            argv += ["--upstream", {"input": upstream}]
        tuned = tuned or (katib and step.name == "train")
        if tuned:
            argv += ["--params", {"input": "params"}]
        steps.append({"name": step.name, "after": list(step.after), "argv": argv, "describe": step.describe})
    spec: dict[str, Any] = {
        "name": dns_label(job.run.name),
        "description": f"hpcpipe run {job.run.name} ({job.run.recipe}): "
        + " -> ".join(s.name for s in STEPS),
        # One line of JSON (YAML too, as config.yaml): kfp copies a parameter's default into the
        # file's header comment verbatim, and a multi-line one would break the YAML.
        "config": json.dumps(job.to_dict()),
        "config_path": CONFIG_PATH,
        **compiled,
        "env": {**compiled["env"], COMPILED_VAR: json.dumps(compiled)},  # check_compiled reads it
        "artifact_types": ARTIFACT_TYPES,
        "steps": steps,
        "katib": None,
    }
    if katib:
        spec["katib"] = {
            "after": "stage",
            # A Katib trial is one pod: the search runs on one node, the train step on all of them.
            # Its own name: the Experiment's ConfigMap must not be the train job's.
            "argv": [cfg.hpcpipe, "hpo", "launch", "katib", CONFIG_PATH, "--workers", str(katib_workers),
                     *[a for kv in _katib_sets(job) for a in ("--set", kv)],
                     "--submit", "--wait", "--best", {"output": "params"}],
        }  # fmt: skip
    return spec


def compiled_platform(job: JobConfig) -> dict[str, Any]:
    """What the pipeline fixes at compile time (each step's image, claims and environment), as JSON
    gives it back."""
    cfg = job.launch.k8s
    return {
        "image": image_ref(cfg),
        "claims": _claims(job),
        "env": dict(sorted(cfg.env.items())),
        "secret_env": {name: ref.split("/", 1) for name, ref in sorted(cfg.secret_env.items())},
    }


_COMPILED_KEYS = {
    "image": "launch.k8s.image",
    "claims": "launch.k8s.data_pvc/checkpoint_pvc/runs_pvc",
    "env": "launch.k8s.env",
    "secret_env": "launch.k8s.secret_env",
}


def check_compiled(job: JobConfig) -> None:
    """In a pipeline step: a ConfigError when the ``config`` parameter gives another image, claims
    or environment than the pipeline was compiled with. The step's own pod has the compiled ones,
    while its train job would take the new ones: a run's steps on two images or two claims."""
    text = os.environ.get(COMPILED_VAR)
    if not text:
        return  # not a pipeline step
    compiled, given = json.loads(text), compiled_platform(job)
    for part, key in _COMPILED_KEYS.items():
        if compiled.get(part) != given[part]:
            raise ConfigError(
                f"{key}: the pipeline parameter 'config' changes it, but the steps' pods have the one "
                f"compiled in (compile the pipeline again: hpcpipe launch kfp)"
            )


def _check_shared_run_dir(job: JobConfig) -> None:
    """Every step runs in its own pod: the run directory and the prepared data must be on claims
    (``render_k8s`` has checked that run.out_dir lies on its claim)."""
    cfg = job.launch.k8s
    if not (cfg.runs_pvc or cfg.checkpoint_pvc):
        raise ConfigError(
            "launch.k8s.runs_pvc (or checkpoint_pvc): a pipeline's steps share the run directory "
            "through it (set run.out_dir under its mount)"
        )
    mounts = [claim["mount"] for claim in _claims(job)]
    shared = {"data.prepared_dir": job.data.prepared_dir, "checkpoint.dir": job.checkpoint.dir}
    for key, path in shared.items():
        # Normalised: /checkpoints/../scratch is not on the claim mounted at /checkpoints.
        if path is not None and not any(under_mount(path, m) for m in mounts):
            raise ConfigError(
                f"{key} {path!r}: the steps run in their own pods and must find it on a claim they "
                f"mount ({' or '.join(mounts)})"
            )


def _check_katib(job: JobConfig, workers: int) -> None:
    if not job.hpo.space:
        raise ConfigError("--katib: the job has no hpo section to search (hpo.space is empty)")
    # Katib's webhook rules, checked now, on the one-pod trials the step searches with.
    overrides = dict(kv.split("=", 1) for kv in _katib_sets(job))
    render_experiment(apply_values(job, overrides), parallel_trials=workers)


def _katib_sets(job: JobConfig) -> list[str]:
    """The Katib step's overrides: one-pod trials, and a study name apart from the train job's."""
    # dns_label of the whole name: a cut of the train job's name could cut its hash, and two runs'
    # Experiments would share one name.
    return ["parallel.nnodes=1", f"hpo.study={dns_label(f'{job.run.name}-hpo')}"]


def _claims(job: JobConfig) -> list[dict[str, str]]:
    cfg = job.launch.k8s
    pairs = (
        (cfg.data_pvc, cfg.data_mount),
        (cfg.checkpoint_pvc, cfg.checkpoint_mount),
        (cfg.runs_pvc, cfg.runs_mount),
    )
    return [{"claim": claim, "mount": mount} for claim, mount in pairs if claim]
