"""A study as a Kubeflow Katib ``Experiment`` (kubeflow.org/v1beta1), checked offline before it is written.

Each trial is the PyTorchJob ``hpcpipe launch k8s --api pytorchjob`` renders (same image, resources,
ConfigMap), its command turned into ``hpcpipe train CONFIG --set KEY=${trialParameters.NAME} ...``.
Where Katib differs from ``hpcpipe hpo`` (read in kubeflow/katib's sources):

- Metrics: the File collector's JSON format keeps only *string* values and mounts an emptyDir over
  the file's directory, fixed when the Experiment is created; metrics.jsonl holds numbers, in a run
  directory named per trial. So the StdOut collector reads the trainer's plain evaluation lines
  (``step 40/200  val_loss 2.1000``); they carry no timestamp, so Katib orders reports as read.
- Early stopping: medianstop only; its ``start_step`` counts metric reports, not training steps.
- No conditional parameters (``when``); one pod per trial (the node agent takes no ``--set``).

The namespace needs the label ``katib.kubeflow.org/metrics-collector-injection=enabled``.
``experiment_warnings`` lists the settings the render drops (the render itself only raises).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from hpcpipe.config import JobConfig, apply_values
from hpcpipe.config.hpo import HpoConfig, ParamSpec
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.hpo.space import check_space, grid_size, maximize
from hpcpipe.launch.k8s_pod import CONFIG_FILE, processes_per_node
from hpcpipe.launch.k8s_validate import validate_manifest
from hpcpipe.launch.kubernetes import PYTORCHJOB_CONTAINER, dns_label, render_k8s

API_VERSION = "kubeflow.org/v1beta1"
# hpo.sampler.name -> Katib algorithm
_BO = "bayesianoptimization"
ALGORITHMS = {"tpe": "tpe", "random": "random", "cmaes": "cmaes", "grid": "grid", "gp": _BO}
KATIB_ALGORITHMS = {*ALGORITHMS.values(), "hyperband", "sobol", "multivariate-tpe"}
# What the default katib-config's services accept (hyperopt: tpe, random; optuna: grid; skopt:
# bayesianoptimization; goptuna: cmaes); they fail the Experiment on any other setting name.
ALGORITHM_SETTINGS = {
    "random": {"random_state"},
    "tpe": {"random_state", "gamma", "prior_weight", "n_EI_candidates"},
    "grid": {"random_state"},
    _BO: {"random_state", "n_initial_points", "base_estimator", "acq_func", "acq_optimizer"},
    "cmaes": {"random_state", "sigma", "restart_strategy"},
}
MEDIANSTOP_SETTINGS = {"min_trials_required", "start_step"}
_SETTING_MINIMUM = {"random_state": 0, "n_initial_points": 0, "min_trials_required": 1, "start_step": 1}
DISTRIBUTIONS = ("uniform", "logUniform", "normal", "logNormal")
TRIAL_NAME = "trialName"  # the trial parameter that carries Katib's trial name into run.name
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")  # a DNS label of at most 40 characters
_PLACEHOLDER = re.compile(r"\$\{trialParameters\..+?\}")
_META_REF = re.compile(r"\$\{trialSpec\.(Name|Namespace|Kind|APIVersion|(Labels|Annotations)\[.+\])\}")
_TWO_GROUPS = re.compile(r".*\(.*\).*\(.*\).*")  # Katib's own test of a metrics filter
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_.+:/-]+")  # Katib joins a StdOut trial's args into `sh -c`
_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
Doc = dict[str, Any]
_CONDITION = 'status.conditions.#(type=="{}")#|#(status=="True")#'  # Katib's default for Kubeflow jobs


def render_experiment(job: JobConfig, parallel_trials: int, namespace: str | None = None) -> list[Doc]:
    """[ConfigMap with the base config, Experiment], validated; UserError naming the key otherwise."""
    _check_study(job)
    name = dns_label(job.hpo.study or job.run.name)
    ns = namespace or job.launch.k8s.namespace
    base = apply_values(job, {"launch.k8s.name": name, "launch.k8s.namespace": ns})
    config_map, trial_job = render_k8s(base, api="pytorchjob")  # what `launch k8s --api pytorchjob` writes
    names = {key: param_name(key) for key in job.hpo.space}
    trial_job["metadata"] = {"labels": trial_job["metadata"]["labels"]}  # Katib names each trial's job
    pod = trial_job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == PYTORCHJOB_CONTAINER)
    container["command"] = _trial_command(job, names)
    spec = _spec(job, names, parallel_trials) | {"trialTemplate": _template(names, trial_job)}
    meta = {"name": name, "namespace": ns, "labels": config_map["metadata"]["labels"]}
    experiment = {"apiVersion": API_VERSION, "kind": "Experiment", "metadata": meta, "spec": spec}
    validate_experiment(experiment)
    return [config_map, experiment]


def experiment_warnings(job: JobConfig) -> list[str]:
    """What ``render_experiment`` leaves out because Katib has no equivalent (one line each)."""
    hpo, lines = job.hpo, []
    if hpo.pruner.name not in ("median", "none"):
        lines.append(f"hpo.pruner.name={hpo.pruner.name}: Katib stops trials early by medianstop only")
    if hpo.sampler.name in ("tpe", "cmaes") and "n_startup_trials" in hpo.sampler.model_fields_set:
        lines.append(f"hpo.sampler.n_startup_trials: Katib's {hpo.sampler.name} has no such setting")
    if hpo.timeout_s is not None:
        lines.append("hpo.timeout_s: a Katib Experiment has no time limit; it ends after hpo.n_trials")
    return lines


def best_parameters(job: JobConfig, experiment: dict[str, Any]) -> dict[str, str]:
    """The best trial of a finished Experiment as ``{config key: value}`` (Katib reports strings;
    ``--set`` parses them as it parses a user's). UserError when Katib found none."""
    names = {param_name(key): key for key in job.hpo.space}
    best = experiment.get("status", {}).get("currentOptimalTrial", {})
    assignments = best.get("parameterAssignments") or []
    if not assignments:
        name = experiment.get("metadata", {}).get("name", "?")
        raise UserError(f"Experiment {name}: Katib reports no best trial (did every trial fail?)")
    return {names.get(a["name"], a["name"]): str(a["value"]) for a in assignments if a["name"] in names}


def param_name(key: str) -> str:
    """A config key as a trial parameter name: ``train.lr`` -> ``train-lr``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", key)


def _check_study(job: JobConfig) -> None:
    hpo, space = job.hpo, job.hpo.space
    for key, param in space.items():
        if param.when:
            raise UserError(f"hpo.space.{key}: conditional parameters ('when') have no Katib equivalent")
    check_space(job)  # keys exist and take their extremes; the recipe evaluates the metric
    if len(set(map(param_name, space))) < len(space):
        raise UserError("hpo.space: two keys give the same Katib parameter name (dots become '-')")
    if not hpo.metric.startswith("val_"):
        # Katib's StdOut collector reads the evaluation lines, which print the val_* metrics only.
        raise UserError(
            f"hpo.metric {hpo.metric}: Katib reads the trials' evaluation lines, which show val_* metrics"
        )
    if job.parallel.node_range != (1, 1):
        raise UserError(f"parallel.nnodes {job.parallel.nnodes}: a Katib trial is one pod; set it to 1")
    if hpo.seed is not None and hpo.seed < 0:
        raise UserError(f"hpo.seed {hpo.seed}: Katib's suggestion services take a random_state >= 0")
    if hpo.sampler.name == "grid" and hpo.n_trials > (size := grid_size(space)):
        raise UserError(f"hpo.n_trials {hpo.n_trials}: Katib's grid refuses more than its {size} points")
    if hpo.sampler.name == "cmaes" and sum(p.type != "categorical" for p in space.values()) < 2:
        raise UserError("hpo.sampler.name=cmaes: Katib's CMA-ES needs two or more int/float parameters")


def _trial_command(job: JobConfig, names: dict[str, str]) -> list[str]:
    cfg = job.launch.k8s
    command = [cfg.hpcpipe, "train", CONFIG_FILE, "--nproc", str(processes_per_node(cfg))]
    for key, name in [*names.items(), ("run.name", TRIAL_NAME)]:
        command += ["--set", f"{key}=${{trialParameters.{name}}}"]
    # The StdOut collector reads rank 0's progress lines, printed only with observe.progress on.
    return [*command, "--set", "observe.progress=true"]


def _spec(job: JobConfig, names: dict[str, str], parallel_trials: int) -> dict[str, Any]:
    hpo = job.hpo
    best = "max" if maximize(job) else "min"
    spec: dict[str, Any] = {
        "objective": {
            "type": f"{best}imize",
            "objectiveMetricName": hpo.metric,
            "additionalMetricNames": [],
            # The local study scores the last evaluation; Katib's "latest" needs timestamped lines.
            "metricStrategies": [{"name": hpo.metric, "value": best}],
        },
        "algorithm": _algorithm(hpo),
        "parallelTrialCount": parallel_trials,
        "maxTrialCount": hpo.n_trials,
        "maxFailedTrialCount": max(1, hpo.n_trials // 2),
        "parameters": [_parameter(key, names[key], param) for key, param in hpo.space.items()],
        "metricsCollectorSpec": {
            "collector": {"kind": "StdOut"},
            "source": {"filter": {"metricsFormat": [rf"\b({re.escape(hpo.metric)})\s+({_NUMBER})"]}},
        },
    }
    if hpo.pruner.name == "median":
        spec["earlyStopping"] = _median_stop(job)
    return spec


def _template(names: dict[str, str], trial_job: dict[str, Any]) -> dict[str, Any]:
    # Worker 0 (the only one): training-operator < 1.8 labels no pod of a worker-only job master.
    primary = {"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}
    params = [{"name": name, "reference": name, "description": key} for key, name in names.items()]
    params.append({"name": TRIAL_NAME, "reference": "${trialSpec.Name}", "description": "run.name"})
    return {
        "primaryContainerName": PYTORCHJOB_CONTAINER,
        "primaryPodLabels": primary,
        "successCondition": _CONDITION.format("Succeeded"),
        "failureCondition": _CONDITION.format("Failed"),
        "trialParameters": params,
        "trialSpec": trial_job,
    }


def _algorithm(hpo: HpoConfig) -> dict[str, Any]:
    name = ALGORITHMS[hpo.sampler.name]
    settings = {} if hpo.seed is None else {"random_state": hpo.seed}
    if name == _BO:
        settings["n_initial_points"] = hpo.sampler.n_startup_trials
    return {"algorithmName": name, "algorithmSettings": _settings(settings)}


def _median_stop(job: JobConfig) -> dict[str, Any]:
    """Reports come at step 0 (never pruned on) and every eval_every steps; the local pruner first
    judges the one at or after n_warmup_steps. Katib's start_step counts reports, that one included."""
    pruner, every = job.hpo.pruner, job.train.eval_every
    start = 1 + max(1, math.ceil(pruner.n_warmup_steps / every)) if every else 2
    settings = {"min_trials_required": max(1, pruner.n_startup_trials), "start_step": start}
    return {"algorithmName": "medianstop", "algorithmSettings": _settings(settings)}


def _settings(values: dict[str, int]) -> list[dict[str, str]]:
    return [{"name": key, "value": str(value)} for key, value in values.items()]


def _parameter(key: str, name: str, param: ParamSpec) -> dict[str, Any]:
    if param.type == "categorical":
        space: dict[str, Any] = {"list": [_choice(key, value) for value in param.choices or []]}
        return {"name": name, "parameterType": "categorical", "feasibleSpace": space}
    kind = "int" if param.type == "int" else "double"
    bounds = {"min": param.low, "max": param.high, "step": param.step}
    space = {k: _number(key, v, kind) for k, v in bounds.items() if v is not None}
    space["distribution"] = "logUniform" if param.log else "uniform"
    return {"name": name, "parameterType": kind, "feasibleSpace": space}


def _number(key: str, value: float, kind: str) -> str:
    if kind == "double":
        return repr(float(value))
    if not float(value).is_integer():
        raise UserError(f"hpo.space.{key}: an int parameter needs a whole-number step")
    return str(int(value))


def _choice(key: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)  # --set reads it back as YAML
    if not _SHELL_SAFE.fullmatch(text):
        raise UserError(f"hpo.space.{key}: choice {value!r}: Katib passes it to `sh -c`; use a plain word")
    return text


# -- the rules of Katib's admission webhook (the Experiment CRD has no schema) -----------------


def validate_experiment(doc: dict[str, Any]) -> None:
    """Raise ConfigError naming the first field Katib's webhook (or the PyTorchJob model) rejects."""
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name") or ""
    is_experiment = doc.get("apiVersion") == API_VERSION and kind == "Experiment"
    _require(is_experiment, "kind", f"{kind!r}: expected an {API_VERSION} Experiment")
    _require(_NAME.fullmatch(name), "metadata.name", f"{name!r}: not a DNS label of at most 40 characters")
    spec = doc.get("spec") or {}
    most = spec.get("maxTrialCount")
    _require(_within(most, 1, None), "spec.maxTrialCount", f"{most!r}: must be an integer > 0")
    for key, low in (("parallelTrialCount", 1), ("maxFailedTrialCount", 0)):
        _require(_within(spec.get(key), low, most), f"spec.{key}", f"{spec.get(key)!r}: not in {low}..{most}")
    objective = spec.get("objective") or {}
    metric, extra = objective.get("objectiveMetricName"), objective.get("additionalMetricNames") or []
    _require(objective.get("type") in ("minimize", "maximize"), "spec.objective.type", "minimize or maximize")
    _require(metric and metric not in extra, "spec.objective.objectiveMetricName", f"{metric!r}: unset/twice")
    algorithm = spec.get("algorithm") or {}
    algo = algorithm.get("algorithmName")
    _require(algo in KATIB_ALGORITHMS, "spec.algorithm.algorithmName", f"{algo!r}: not a Katib algorithm")
    _check_settings("spec.algorithm", algorithm, ALGORITHM_SETTINGS.get(str(algo)))
    if (stop := spec.get("earlyStopping")) is not None:
        algo = stop.get("algorithmName")
        where = "spec.earlyStopping.algorithmName"
        _require(algo == "medianstop", where, f"{algo!r}: Katib's only early stopping is medianstop")
        _check_settings("spec.earlyStopping", stop, MEDIANSTOP_SETTINGS)
    _require(spec.get("parameters"), "spec.parameters", "at least one parameter")
    for i, param in enumerate(spec["parameters"]):
        _check_parameter(f"spec.parameters[{i}]", param)
    _check_template(spec.get("trialTemplate") or {}, [p.get("name") for p in spec["parameters"]])
    source = (spec.get("metricsCollectorSpec") or {}).get("source") or {}
    for i, pattern in enumerate((source.get("filter") or {}).get("metricsFormat") or []):
        where = f"spec.metricsCollectorSpec.source.filter.metricsFormat[{i}]"
        _require(_TWO_GROUPS.fullmatch(pattern), where, "needs two groups: (name) and (value)")


def _require(ok: object, path: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"katib Experiment {path}: {message}")


def _within(count: Any, low: int, most: Any) -> bool:
    return count is None or (isinstance(count, int) and low <= count and (most is None or count <= most))


def _check_settings(path: str, algorithm: dict[str, Any], allowed: set[str] | None) -> None:
    for i, setting in enumerate(algorithm.get("algorithmSettings") or []):
        name, value, where = setting.get("name"), setting.get("value"), f"{path}.algorithmSettings[{i}]"
        _require(allowed is None or name in allowed, where, f"{name!r}: not in {sorted(allowed or [])}")
        _require(isinstance(value, str), where, f"{name}: the value must be a string")
        low = _SETTING_MINIMUM.get(name)
        ok = low is None or (value.lstrip("-").isdigit() and int(value) >= low)
        _require(ok, where, f"{name} {value!r}: must be an integer >= {low}")


def _check_parameter(path: str, param: dict[str, Any]) -> None:
    kind, space = param.get("parameterType"), param.get("feasibleSpace") or {}
    _require(param.get("name"), f"{path}.name", "must be set")
    _require(kind in ("double", "int", "discrete", "categorical"), f"{path}.parameterType", f"{kind!r}")
    dist = space.get("distribution", "uniform")
    _require(dist in DISTRIBUTIONS, f"{path}.feasibleSpace.distribution", f"{dist!r}: not in Katib")
    if kind in ("double", "int"):
        ok = _ordered(space.get("min"), space.get("max")) and isinstance(space.get("step", ""), str)
        _require(ok and not space.get("list"), f"{path}.feasibleSpace", "min <= max (and step) as strings")
    else:
        items = space.get("list") or []
        listed = (
            items and all(isinstance(v, str) for v in items) and not space.keys() & {"min", "max", "step"}
        )
        _require(listed, f"{path}.feasibleSpace", f"a {kind} parameter takes a list of strings only")


def _ordered(low: Any, high: Any) -> bool:
    try:
        return isinstance(low, str) and isinstance(high, str) and float(low) <= float(high)
    except ValueError:
        return False


def _check_template(template: dict[str, Any], parameters: list[Any]) -> None:
    path, trial_spec = "spec.trialTemplate", template.get("trialSpec") or {}
    _require(trial_spec.get("apiVersion") and trial_spec.get("kind"), f"{path}.trialSpec", "apiVersion, kind")
    meta = trial_spec.get("metadata") or {}
    _require(not meta.keys() & {"name", "namespace"}, f"{path}.trialSpec.metadata", "Katib sets the name")
    primary, containers = template.get("primaryContainerName"), _container_names(trial_spec)
    _require(primary in containers, f"{path}.primaryContainerName", f"{primary!r}: not a trialSpec container")
    text, names, refs = json.dumps(trial_spec), set(), set()
    for i, param in enumerate(template.get("trialParameters") or []):
        name, ref = param.get("name") or "", param.get("reference") or ""
        where = f"{path}.trialParameters[{i}]"
        fresh = name and ref and name not in names and ref not in refs and not set("{}") & set(name)
        _require(fresh, where, "name and reference: set, unique, and no braces in the name")
        _require(ref in parameters or _META_REF.fullmatch(ref), f"{where}.reference", f"{ref!r}: unknown")
        placeholder = f"${{trialParameters.{name}}}"
        _require(placeholder in text, f"{where}.name", f"{placeholder} does not appear in the trialSpec")
        names.add(name)
        refs.add(ref)
        text = text.replace(placeholder, "")
    undeclared = _PLACEHOLDER.findall(text)
    _require(not undeclared, f"{path}.trialSpec", f"{', '.join(undeclared)}: not declared in trialParameters")
    if trial_spec["kind"] == "PyTorchJob":
        try:
            validate_manifest(trial_spec)  # the kubeflow-training model, as `launch k8s` checks it
        except ConfigError as exc:
            _require(False, f"{path}.trialSpec", str(exc))


def _container_names(node: Any) -> set[Any]:
    found: set[Any] = set()
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        if key == "containers" and isinstance(value, list):
            found |= {c.get("name") for c in value if isinstance(c, dict)}
        found |= _container_names(value)
    return found
