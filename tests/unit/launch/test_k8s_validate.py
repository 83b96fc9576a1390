"""Every manifest hpcpipe writes passes Kubernetes' own schemas (tests/k8s_schemas.py): the core
objects against Kubernetes' OpenAPI (kubernetes-validate), TrainJob, ClusterTrainingRuntime,
PyTorchJob, the Katib Experiment, PodMonitor and PrometheusRule against the operators' vendored
CRDs. The chart's objects are checked in launch/test_helm_values.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from tests import k8s_schemas

from hpcpipe.config import load_config
from hpcpipe.hpo.katib import render_experiment
from hpcpipe.launch.kubernetes import render_k8s

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = str(ROOT / "examples" / "k8s" / "h200-elastic.yaml")
METRICS = ["observe.prometheus.port=9400", "observe.prometheus.host=0.0.0.0"]


@pytest.mark.parametrize(
    ("config", "sets", "api", "runtime", "kinds"),
    [
        (EXAMPLE, [], "pytorchjob", False, ["ConfigMap", "PyTorchJob"]),
        (EXAMPLE, ["parallel.nnodes=32", *METRICS], "trainjob", True,
         ["ConfigMap", "ClusterTrainingRuntime", "TrainJob"]),
        (EXAMPLE, ["parallel.nnodes=32", "launch.k8s.priority_class=null"], "trainjob", False,
         ["ConfigMap", "TrainJob"]),
        ("tiny", [], "trainjob", False, ["ConfigMap", "TrainJob"]),
        ("resnet18-cifar10", METRICS, "pytorchjob", False, ["ConfigMap", "PyTorchJob"]),
    ],
)  # fmt: skip
def test_launch_k8s_manifests_pass_the_schemas(
    config: str, sets: list[str], api: str, runtime: bool, kinds: list[str]
) -> None:
    docs = render_k8s(load_config(config, sets), api, runtime)  # type: ignore[arg-type]
    assert k8s_schemas.check_all(docs) == kinds


def test_the_katib_experiment_and_its_trial_job_pass_the_schemas() -> None:
    space = "hpo.space={train.lr: {type: float, low: 1.0e-4, high: 1.0, log: true}}"
    config_map, experiment = render_experiment(load_config("tiny-hpo", [space]), parallel_trials=2)
    assert k8s_schemas.check_all([config_map, experiment]) == ["ConfigMap", "Experiment"]
    # Katib's CRD constrains nothing: the trial template is held to the PyTorchJob CRD instead,
    # with the name Katib gives each trial's job.
    trial = copy.deepcopy(experiment["spec"]["trialTemplate"]["trialSpec"])
    trial["metadata"]["name"] = "trial-1"
    k8s_schemas.check(trial)


def test_the_deploy_files_pass_the_schemas() -> None:
    monitor = yaml.safe_load((ROOT / "deploy" / "k8s" / "podmonitor.yaml").read_text())
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "hpcpipe"},
        "spec": rules,
    }
    assert k8s_schemas.check_all([monitor, rule]) == ["PodMonitor", "PrometheusRule"]


def _pytorchjob() -> dict:  # type: ignore[type-arg]
    return render_k8s(load_config(EXAMPLE, []), "pytorchjob")[1]


def _worker(doc: dict) -> dict:  # type: ignore[type-arg]
    return doc["spec"]["pytorchReplicaSpecs"]["Worker"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: _worker(d).update(replicas="32"), "'32' is not of type 'integer'"),
        (lambda d: d["spec"]["elasticPolicy"].update(maxRestart=3), "'maxRestart' was unexpected"),
        (lambda d: _worker(d)["template"]["spec"]["containers"][0].pop("name"), "'name' is a required"),
        (lambda d: d["metadata"].update(lables={}), "unknown field(s) ['lables']"),
    ],
)  # fmt: skip
def test_the_crd_check_refuses_a_wrong_type_an_unknown_field_and_a_missing_one(change, message) -> None:  # type: ignore[no-untyped-def]
    doc = _pytorchjob()
    k8s_schemas.check(doc)
    change(doc)
    with pytest.raises(k8s_schemas.SchemaError) as caught:
        k8s_schemas.check(doc)
    assert message in str(caught.value)


def test_the_core_check_refuses_an_unknown_field() -> None:
    config_map = render_k8s(load_config("tiny", []), "trainjob")[0]
    config_map["data"]["n"] = 1  # ConfigMap data values are strings
    with pytest.raises(k8s_schemas.SchemaError, match=r"ConfigMap data\.n"):
        k8s_schemas.check(config_map)
