"""`hpcpipe.hpo.katib`: a study rendered as a Katib Experiment and checked offline (no cluster)."""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.hpo import katib
from hpcpipe.hpo.katib import (
    TRIAL_NAME,
    experiment_warnings,
    param_name,
    render_experiment,
    validate_experiment,
)
from hpcpipe.launch.kubernetes import PYTORCHJOB_CONTAINER, render_k8s, to_yaml
from hpcpipe.observe.progress import TrainProgress

SPACE = (
    "hpo.space={train.lr: {type: float, low: 1e-4, high: 1e-2, log: true}, "
    "model.n_layers: {type: int, low: 1, high: 3}, "
    "train.precision: {type: categorical, choices: [fp32, bf16]}}"
)
GRID_SPACE = (
    "hpo.space={model.n_layers: {type: int, low: 1, high: 3}, "
    "train.lr: {type: float, low: 0.001, high: 0.003, step: 0.001}}"
)


def _job(*overrides: str, space: str = SPACE) -> JobConfig:
    return load_config("quickstart", [space, *overrides])


def _experiment(*overrides: str, space: str = SPACE, parallel: int = 2) -> dict[str, Any]:
    return render_experiment(_job(*overrides, space=space), parallel)[1]


def _container(experiment: dict[str, Any]) -> dict[str, Any]:
    worker = experiment["spec"]["trialTemplate"]["trialSpec"]["spec"]["pytorchReplicaSpecs"]["Worker"]
    return worker["template"]["spec"]["containers"][0]


# -- the rendered documents -------------------------------------------------------------------


def test_renders_a_configmap_and_a_valid_experiment() -> None:
    config_map, experiment = render_experiment(_job(), 2)
    validate_experiment(experiment)
    assert (config_map["kind"], experiment["kind"]) == ("ConfigMap", "Experiment")
    assert experiment["apiVersion"] == "kubeflow.org/v1beta1"
    assert experiment["metadata"]["name"] == "quickstart"
    assert config_map["metadata"]["name"] == "quickstart-config"
    spec = experiment["spec"]
    assert spec["objective"]["type"] == "minimize"
    assert spec["objective"]["objectiveMetricName"] == "val_loss"
    assert (spec["parallelTrialCount"], spec["maxTrialCount"], spec["maxFailedTrialCount"]) == (2, 20, 10)
    by_name = {p["name"]: p for p in spec["parameters"]}
    assert by_name["train-lr"] == {
        "name": "train-lr",
        "parameterType": "double",
        "feasibleSpace": {"min": "0.0001", "max": "0.01", "distribution": "logUniform"},
    }
    assert by_name["model-n_layers"]["parameterType"] == "int"
    assert by_name["model-n_layers"]["feasibleSpace"] == {"min": "1", "max": "3", "distribution": "uniform"}
    assert by_name["train-precision"]["feasibleSpace"] == {"list": ["fp32", "bf16"]}


def test_trial_is_the_launch_k8s_pytorchjob_with_a_train_command() -> None:
    job = _job()
    config_map, experiment = render_experiment(job, 2)
    template = experiment["spec"]["trialTemplate"]
    trial_spec = template["trialSpec"]
    assert "name" not in trial_spec["metadata"] and "namespace" not in trial_spec["metadata"]
    container = _container(experiment)
    assert template["primaryContainerName"] == container["name"] == PYTORCHJOB_CONTAINER
    # Everything but the command is what `hpcpipe launch k8s --api pytorchjob` renders.
    direct = render_k8s(job, api="pytorchjob")[1]["spec"]["pytorchReplicaSpecs"]["Worker"]
    expected = {k: v for k, v in direct["template"]["spec"]["containers"][0].items() if k != "command"}
    assert {k: v for k, v in container.items() if k != "command"} == expected
    pod = trial_spec["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    command = container["command"]
    assert command[:5] == ["hpcpipe", "train", "/etc/hpcpipe/config.yaml", "--nproc", "1"]
    sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
    assert "train.lr=${trialParameters.train-lr}" in sets
    assert f"run.name=${{trialParameters.{TRIAL_NAME}}}" in sets
    assert "observe.progress=true" in sets
    params = {p["name"]: p for p in template["trialParameters"]}
    assert params[TRIAL_NAME]["reference"] == "${trialSpec.Name}"
    assert params["train-lr"] == {"name": "train-lr", "reference": "train-lr", "description": "train.lr"}


def test_command_survives_katibs_sh_c_wrapping() -> None:
    """The StdOut collector joins the args into one `sh -c` string: values must stay single words."""
    command = _container(_experiment())["command"]
    filled = [re.sub(r"\$\{trialParameters\.[^}]+\}", "0.001", arg) for arg in command]
    assert shlex.split(" ".join(filled)) == filled


def test_metrics_filter_reads_the_trainers_evaluation_lines(capsys: pytest.CaptureFixture[str]) -> None:
    collector = _experiment()["spec"]["metricsCollectorSpec"]
    assert collector["collector"] == {"kind": "StdOut"}
    (pattern,) = collector["source"]["filter"]["metricsFormat"]
    progress = TrainProgress(total=400, enabled=True)  # not a terminal: plain lines, as in a pod
    progress.show({"step": 40, "val_loss": 2.1, "val_ppl": 8.166})
    progress.show({"step": 50, "loss": 2.3, "lr": 1e-3, "grad_norm": 0.5})
    lines = capsys.readouterr().out.splitlines()
    assert re.findall(pattern, lines[0]) == [("val_loss", "2.1000")]
    assert re.findall(pattern, lines[1]) == []
    progress.show({"step": 60, "val_loss": 3.25e-5})  # it read 0.0000: every such trial tied
    assert re.findall(pattern, capsys.readouterr().out) == [("val_loss", "3.25e-05")]


def test_a_metric_the_evaluation_lines_do_not_show_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin recipe's metric without the val_ prefix: the Experiment rendered, and its
    trials never reported it."""
    monkeypatch.setattr(katib, "check_space", lambda job: None)  # say the recipe evaluates it
    with pytest.raises(UserError, match=r"hpo\.metric bleu: Katib reads the trials' evaluation lines"):
        _experiment("hpo.metric=bleu")


def test_yaml_round_trip() -> None:
    docs = render_experiment(_job(), 3, namespace="hpo")
    back = list(yaml.safe_load_all(to_yaml(docs)))
    assert back == docs
    validate_experiment(back[1])
    assert {doc["metadata"]["namespace"] for doc in back} == {"hpo"}


def test_name_from_the_study_is_a_short_dns_label() -> None:
    name = _experiment("hpo.study=My_Study.For-A-Very-Long-Learning-Rate-Sweep-2026")["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40
    assert name.startswith("my-study-for-a-very")


def test_param_name_replaces_dots() -> None:
    assert param_name("train.lr") == "train-lr"


# -- sampler and pruner mapping ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sampler", "algorithm", "space"),
    [
        ("tpe", "tpe", SPACE),
        ("random", "random", SPACE),
        ("cmaes", "cmaes", SPACE),
        ("gp", "bayesianoptimization", SPACE),
        ("grid", "grid", GRID_SPACE),
    ],
)
def test_sampler_mapping(sampler: str, algorithm: str, space: str) -> None:
    overrides = [f"hpo.sampler.name={sampler}", "hpo.seed=7", "hpo.n_trials=6"]
    spec = _experiment(*overrides, space=space)["spec"]
    settings = {s["name"]: s["value"] for s in spec["algorithm"]["algorithmSettings"]}
    assert spec["algorithm"]["algorithmName"] == algorithm
    assert settings["random_state"] == "7"
    assert ("n_initial_points" in settings) == (sampler == "gp")


def test_no_seed_no_random_state_and_a_negative_seed_is_refused() -> None:
    assert _experiment("hpo.seed=null")["spec"]["algorithm"]["algorithmSettings"] == []
    with pytest.raises(UserError, match=r"hpo\.seed"):
        _experiment("hpo.seed=-1")


def test_median_pruner_becomes_medianstop_counting_reports() -> None:
    overrides = ["hpo.pruner.n_startup_trials=0", "hpo.pruner.n_warmup_steps=250", "train.eval_every=100"]
    stop = _experiment(*overrides)["spec"]["earlyStopping"]
    settings = {s["name"]: s["value"] for s in stop["algorithmSettings"]}
    assert stop["algorithmName"] == "medianstop"
    # Reports at steps 0, 100, 200, 300: the first judged is at 300, the 4th report.
    assert settings == {"min_trials_required": "1", "start_step": "4"}


@pytest.mark.parametrize(
    ("pruner", "warned"), [("hyperband", True), ("successive_halving", True), ("none", False)]
)
def test_other_pruners_have_no_early_stopping(pruner: str, warned: bool) -> None:
    job = _job(f"hpo.pruner.name={pruner}")
    assert "earlyStopping" not in render_experiment(job, 2)[1]["spec"]
    assert any("hpo.pruner.name" in line for line in experiment_warnings(job)) == warned


def test_warnings_for_settings_katib_drops() -> None:
    assert experiment_warnings(_job()) == []
    lines = experiment_warnings(_job("hpo.sampler.n_startup_trials=3", "hpo.timeout_s=600"))
    assert [line.split(":")[0] for line in lines] == ["hpo.sampler.n_startup_trials", "hpo.timeout_s"]


def test_maximized_metric() -> None:
    objective = _experiment("hpo.direction=maximize")["spec"]["objective"]
    assert objective["type"] == "maximize"
    assert objective["metricStrategies"] == [{"name": "val_loss", "value": "max"}]


# -- studies Katib cannot run -----------------------------------------------------------------


def test_conditional_parameter_is_refused_naming_the_key() -> None:
    space = (
        "hpo.space={train.optimizer: {type: categorical, choices: [adamw, sgd]}, "
        "train.momentum: {type: float, low: 0.8, high: 0.99, when: {train.optimizer: sgd}}}"
    )
    with pytest.raises(UserError, match=r"hpo\.space\.train\.momentum: conditional parameters \('when'\)"):
        _experiment(space=space)


@pytest.mark.parametrize(
    ("overrides", "space", "match"),
    [
        (["hpo.metric=bfcl_accuracy"], SPACE, "evaluates val_loss, val_ppl"),
        (["parallel.nnodes=2"], SPACE, "parallel.nnodes"),
        (["hpo.sampler.name=grid", "hpo.n_trials=10"], GRID_SPACE, "than its 9 points"),
        (["hpo.sampler.name=grid"], SPACE, "step"),
        (["hpo.sampler.name=cmaes"], "hpo.space={train.lr: {type: float, low: 0.001, high: 0.01}}", "cmaes"),
        ([], "hpo.space={model.n_layers: {type: int, low: 1, high: 3, step: 1.5}}", "whole-number step"),
        ([], "hpo.space={data.prepared_dir: {type: categorical, choices: ['data/a b']}}", "sh -c"),
        ([], "hpo.space={train.nope: {type: int, low: 1, high: 3}}", "train.nope"),
    ],
)
def test_refused_studies(overrides: list[str], space: str, match: str) -> None:
    with pytest.raises(UserError, match=re.escape(match)):
        _experiment(*overrides, space=space)


# -- validate_experiment: each webhook rule ---------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value

    return mutate


def _drop_first_set(doc: dict[str, Any]) -> None:
    command = _container(doc)["command"]
    del command[command.index("--set") : command.index("--set") + 2]  # train.lr's placeholder


def _add_undeclared(doc: dict[str, Any]) -> None:
    _container(doc)["command"] += ["--set", "train.steps=${trialParameters.ghost}"]


def _add_unknown_container_field(doc: dict[str, Any]) -> None:
    _container(doc)["imagePullPolicyy"] = "Always"


RULES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "bad name": (_set("metadata.name", "My_Study"), "metadata.name"),
    "long name": (_set("metadata.name", "a" * 41), "metadata.name"),
    "parallel > max": (_set("spec.parallelTrialCount", 21), "spec.parallelTrialCount"),
    "parallel 0": (_set("spec.parallelTrialCount", 0), "spec.parallelTrialCount"),
    "max 0": (_set("spec.maxTrialCount", 0), "spec.maxTrialCount"),
    "failed > max": (_set("spec.maxFailedTrialCount", 99), "spec.maxFailedTrialCount"),
    "objective type": (_set("spec.objective.type", "lowest"), "spec.objective.type"),
    "no metric": (_set("spec.objective.objectiveMetricName", ""), "spec.objective.objectiveMetricName"),
    "unknown algorithm": (_set("spec.algorithm.algorithmName", "optuna"), "spec.algorithm.algorithmName"),
    "unknown setting": (
        _set("spec.algorithm.algorithmSettings", [{"name": "n_startup_trials", "value": "5"}]),
        "spec.algorithm.algorithmSettings[0]",
    ),
    "setting not a string": (
        _set("spec.algorithm.algorithmSettings", [{"name": "random_state", "value": 3}]),
        "spec.algorithm.algorithmSettings[0]",
    ),
    "other early stopping": (_set("spec.earlyStopping.algorithmName", "hyperband"), "spec.earlyStopping"),
    "medianstop setting": (
        _set("spec.earlyStopping.algorithmSettings.0.name", "min_trials"),
        "spec.earlyStopping.algorithmSettings[0]",
    ),
    "start_step 0": (
        _set("spec.earlyStopping.algorithmSettings.1.value", "0"),
        "spec.earlyStopping.algorithmSettings[1]",
    ),
    "no parameters": (_set("spec.parameters", []), "spec.parameters"),
    "parameter type": (_set("spec.parameters.0.parameterType", "float"), "spec.parameters[0].parameterType"),
    "min > max": (_set("spec.parameters.0.feasibleSpace.min", "1.0"), "spec.parameters[0].feasibleSpace"),
    "number not string": (_set("spec.parameters.1.feasibleSpace.max", 3), "spec.parameters[1].feasibleSpace"),
    "distribution": (
        _set("spec.parameters.0.feasibleSpace.distribution", "loguniform"),
        "spec.parameters[0].feasibleSpace.distribution",
    ),
    "list of numbers": (
        _set("spec.parameters.2.feasibleSpace.list", [1]),
        "spec.parameters[2].feasibleSpace",
    ),
    "primary container": (
        _set("spec.trialTemplate.primaryContainerName", "node"),
        "spec.trialTemplate.primaryContainerName",
    ),
    "unknown reference": (
        _set("spec.trialTemplate.trialParameters.0.reference", "lr"),
        "spec.trialTemplate.trialParameters[0].reference",
    ),
    "placeholder missing": (_drop_first_set, "spec.trialTemplate.trialParameters[0].name"),
    "placeholder undeclared": (_add_undeclared, "${trialParameters.ghost}"),
    "trial named": (_set("spec.trialTemplate.trialSpec.metadata.name", "x"), "trialSpec.metadata"),
    "pytorchjob model": (_add_unknown_container_field, "spec.trialTemplate.trialSpec"),
    "filter groups": (
        _set("spec.metricsCollectorSpec.source.filter.metricsFormat", ["val_loss=([0-9.]+)"]),
        "metricsFormat[0]",
    ),
}


@pytest.fixture(scope="module")
def experiment() -> dict[str, Any]:
    return _experiment()


@pytest.mark.parametrize("rule", list(RULES))
def test_validate_experiment_catches(rule: str, experiment: dict[str, Any]) -> None:
    mutate, where = RULES[rule]
    doc = copy.deepcopy(experiment)
    mutate(doc)
    with pytest.raises(ConfigError, match=re.escape(where)):
        validate_experiment(doc)
