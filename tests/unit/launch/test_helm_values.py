"""deploy/helm/hpcpipe, rendered and linted by the real Helm engine (helm-python-sdk embeds Helm 4).

The chart and ``hpcpipe launch k8s`` must not drift: for every shipped example the job objects the
chart renders from ``hpcpipe launch helm-values`` equal, field by field, what ``launch k8s``
renders (Helm's own bookkeeping labels aside). Every rendered object passes Kubernetes' schemas
(``tests/k8s_schemas.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import k8s_schemas
from tests.helpers import run_cli

from hpcpipe.config import load_config
from hpcpipe.launch.helm_values import helm_values, split_image
from hpcpipe.launch.kubernetes import render_k8s

helm = pytest.importorskip(
    "helm_python", reason="helm-python-sdk is a test dependency (make test installs it)"
)

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "hpcpipe"
EXAMPLE = str(ROOT / "examples" / "k8s" / "h200-elastic.yaml")
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
JOB_KINDS = ("ConfigMap", "TrainJob", "ClusterTrainingRuntime", "PyTorchJob")

RUNS_CLAIM = ("launch.k8s.runs_pvc=cephfs-runs", "run.out_dir=/runs", "checkpoint.durable_dir=/checkpoints/g")
RETYPED = (
    "run.name=no",
    "launch.k8s.secret_env={T: tok/1234}",
    'launch.k8s.env={A: "on"}',
    "launch.k8s.shm_size=17179869184",
    "launch.k8s.extra_resources={example.com/x: 1000000}",
)
# (config, --set overrides, api, --runtime): the shipped example under each API, and presets.
CASES = [
    pytest.param(EXAMPLE, [], "pytorchjob", False, id="h200-elastic-pytorchjob"),
    pytest.param(EXAMPLE, ["parallel.nnodes=32"], "trainjob", True, id="h200-trainjob-runtime"),
    pytest.param(EXAMPLE, ["parallel.nnodes=32", "launch.k8s.priority_class=null"], "trainjob", False,
                 id="h200-trainjob"),
    pytest.param(
        EXAMPLE,
        ["observe.prometheus.port=9400", "observe.prometheus.host=0.0.0.0"],
        "pytorchjob",
        False,
        id="h200-metrics",
    ),
    pytest.param(EXAMPLE, [*RUNS_CLAIM], "pytorchjob", False, id="h200-runs-claim"),
    pytest.param("tiny", [], "trainjob", False, id="tiny"),
    pytest.param("tiny", ["fault.preempt_grace_s=300"], "trainjob", False, id="preempt-grace"),
    # Values YAML would re-type if a template forgot to quote them: a name `no`, a numeric secret
    # key, an env value `on`, a byte-count /dev/shm, a large extended resource.
    pytest.param("tiny", [*RETYPED], "pytorchjob", False, id="values-that-yaml-would-retype"),
    pytest.param("gpt-124m", ["launch.k8s.gpus_per_node=8"], "trainjob", False, id="gpt-124m"),
    # The label hpcpipe.dev/layout (the chart had none): tensor parallel, and pipeline on 2 nodes.
    pytest.param("gpt-124m", ["launch.k8s.gpus_per_node=8", "parallel.tp=2", "parallel.strategy=fsdp"],
                 "trainjob", False, id="gpt-124m-tp2"),
    pytest.param("gpt-124m", ["launch.k8s.gpus_per_node=8", "parallel.pp=2", "parallel.nnodes=2"],
                 "pytorchjob", False, id="gpt-124m-pp2"),
    pytest.param("resnet18-cifar10", ["launch.k8s.image=registry.local:5000/hpcpipe"], "pytorchjob", False,
                 id="resnet18-registry-port"),
    pytest.param("lora-fc-smollm2", ["launch.k8s.env={HF_HOME: /cache/hf}"], "trainjob", False, id="lora"),
    pytest.param("tiny", ["launch.k8s.image_pull_secrets=[regcred, other.cred]"], "pytorchjob", False,
                 id="pull-secrets"),
]  # fmt: skip


def render(values: dict[str, Any], namespace: str = "default", name: str = "release") -> list[dict[str, Any]]:
    """The chart's objects for ``values`` (NOTES.txt left out)."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name=name, namespace=namespace)
    return [
        doc
        for path, text in sorted(files.items())
        if path.endswith(".yaml")
        for doc in k8s_schemas.load_docs(text)
    ]


def without_helm_labels(doc: dict[str, Any]) -> dict[str, Any]:
    """Helm's bookkeeping (its labels, and the resource policy that keeps the shared runtime) off."""
    labels = doc["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    annotations = doc["metadata"].pop("annotations", {})
    annotations.pop("helm.sh/resource-policy", None)
    if annotations:
        doc["metadata"]["annotations"] = annotations
    return doc


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The path of the first field where ``a`` and ``b`` differ, and both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path or '.'}: launch k8s {a!r}, chart {b!r}"


@pytest.mark.parametrize(("config", "sets", "api", "runtime"), CASES)
def test_the_chart_renders_what_launch_k8s_renders(
    config: str, sets: list[str], api: str, runtime: bool
) -> None:
    job = load_config(config, sets)
    expected = render_k8s(job, api, runtime)  # type: ignore[arg-type]
    values = helm_values(job, api, runtime)  # type: ignore[arg-type]
    rendered = [
        without_helm_labels(d) for d in render(values, job.launch.k8s.namespace) if d["kind"] in JOB_KINDS
    ]
    assert sorted(d["kind"] for d in rendered) == sorted(d["kind"] for d in expected)  # no more, no less
    by_kind = {d["kind"]: d for d in rendered}
    for want in expected:
        difference = first_difference(want, by_kind[want["kind"]])
        assert difference is None, difference
    k8s_schemas.check_all(render(values, job.launch.k8s.namespace))


def test_lint_is_clean_with_the_defaults_and_with_the_example() -> None:
    example = helm_values(load_config(EXAMPLE, []), "pytorchjob")
    for values in (None, example, {"monitoring": {"enabled": True}, "metrics": {"port": 9400}}):
        result = helm.lint(str(CHART), values=values, strict=True, kube_version="v1.33.0")
        assert result["errors"] == [], result
        assert result["total_charts_linted"] == 1


def test_the_defaults_render_a_tiny_trainjob_that_passes_the_schemas() -> None:
    docs = render({}, name="smoke")
    assert k8s_schemas.check_all(docs) == ["ConfigMap", "TrainJob"]
    train_job = docs[1]
    assert train_job["metadata"]["name"] == "smoke"
    command = train_job["spec"]["trainer"]["command"]
    assert command[command.index("--rdzv-id") + 1] == "smoke"  # the rendezvous id is the job's name
    # The default job's fault.preempt_grace_s is 30: the agent waits 60 s, the pod 75 s.
    assert command[command.index("--grace") + 1] == "60"
    patch = train_job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 75


def test_the_default_config_is_a_valid_config_the_tiny_preset(tmp_path: Path) -> None:
    """The default was `preset: tiny`, which no config loader takes: the documented smoke install
    (`helm install smoke deploy/helm/hpcpipe`) failed in every pod with `unknown config key 'preset'`."""
    [config_map] = [d for d in render({}, name="smoke") if d["kind"] == "ConfigMap"]
    mounted = tmp_path / "config.yaml"  # as the pods read it: launch agent /etc/hpcpipe/config.yaml
    mounted.write_text(config_map["data"]["config.yaml"])
    # The same job as the config `launch helm-values tiny` writes (its full, resolved form).
    assert load_config(mounted) == load_config("tiny")


def test_monitoring_claims_and_an_ephemeral_node_cache_render_and_pass_the_schemas() -> None:
    values = {
        "api": "pytorchjob",
        "nodes": {"min": 2, "max": 4},
        "metrics": {"port": 9400},
        "monitoring": {"enabled": True},
        "persistence": {
            "dataset": {"enabled": True, "mountPath": "/data", "storageClass": "cephfs"},
            "checkpoints": {"enabled": True, "existingClaim": "ckpts", "mountPath": "/checkpoints"},
        },
        "nodeCache": {"enabled": True, "type": "ephemeral", "storageClass": "local-nvme", "size": "1Ti"},
    }
    docs = render(values, name="big")
    kinds = k8s_schemas.check_all(docs)
    assert sorted(kinds) == sorted(
        ["ConfigMap", "ConfigMap", "PodMonitor", "PrometheusRule", "PersistentVolumeClaim", "PyTorchJob"]
    )
    [claim] = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "big-dataset"  # created; the checkpoints claim exists already
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    [monitor] = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"  # job="hpcpipe" for HpcpipeRankDown
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == alerts  # the promtool-tested rules, unchanged
    dashboard = next(d for d in docs if d["metadata"]["name"] == "big-dashboard")
    assert dashboard["data"]["hpcpipe.json"] == (ROOT / "deploy" / "grafana" / "hpcpipe.json").read_text()
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    cache = next(v for v in pod["volumes"] if v["name"] == "node-cache")
    assert cache["ephemeral"]["volumeClaimTemplate"]["spec"]["storageClassName"] == "local-nvme"
    assert pod["initContainers"][0]["name"] == "stage"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"resources": {"gpu": {"count": -1}}}, "/resources/gpu/count"),
        ({"resources": {"gpu": {"count": "eight"}}}, "got string, want integer"),
        ({"gpus": 8}, "additional properties 'gpus' not allowed"),
        ({"api": "mpijob"}, "/api"),
        ({"image": {"repository": "x", "digest": "sha256:nothex"}}, "/image/digest"),
        ({"shmSize": "16 GiB"}, "/shmSize"),
        # What launch.k8s refuses the schema refused not (the rendered job broke, or was refused):
        # a negative quantity, a zero extended resource, an exporter port without room for 64 ranks.
        ({"resources": {"memory": "-8Gi"}}, "/resources/memory"),
        ({"resources": {"memory": -8}}, "/resources/memory"),
        ({"resources": {"extra": {"rdma/ib": 0}}}, "/resources/extra/rdma~1ib"),
        ({"metrics": {"port": 65535}}, "/metrics/port"),
    ],
)
def test_a_wrong_value_is_refused_by_the_schema(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmValuesError) as caught:
        chart.render(values, name="x")
    assert message in str(caught.value.detail)


@pytest.mark.parametrize(
    ("values", "release", "message"),
    [
        ({"config": ""}, "x", "config: the job's hpcpipe config"),
        ({"nodes": {"min": 2, "max": 4}}, "x", "a TrainJob (Kubeflow Trainer v2) has no elastic policy"),
        ({"priorityClassName": "high"}, "x", "priorityClassName: a TrainJob cannot set it"),
        ({"monitoring": {"enabled": True}}, "x", "monitoring.enabled: set metrics.port"),
        ({}, "a" * 41, "longer than 40 characters"),  # the release name, when nameOverride is empty
        ({"nameOverride": "a" * 41}, "x", "/nameOverride': maxLength"),
        ({"api": "pytorchjob", "runtime": {"install": True}}, "x", "goes with api=trainjob"),
        ({"api": "pytorchjob", "nodes": {"min": 4, "max": 2}}, "x", "nodes.min 4 is more than nodes.max 2"),
        # launch.k8s refuses both; the chart rendered ranks sharing a GPU, and ports above 65535.
        (
            {"nprocPerNode": 16, "resources": {"gpu": {"count": 8}}},
            "x",
            "nprocPerNode 16 is more than resources.gpu.count 8: ranks would share a GPU",
        ),
        (
            {"api": "pytorchjob", "nprocPerNode": 100, "metrics": {"port": 65471}},
            "x",
            "metrics.port 65471: the exporter of local rank 99 would listen on 65570, above 65535",
        ),
    ],
)
def test_a_missing_or_inconsistent_value_is_helms_message_not_a_broken_manifest(
    values: dict[str, Any], release: str, message: str
) -> None:
    with (
        helm.Chart.load(str(CHART)) as chart,
        pytest.raises((helm.HelmRenderError, helm.HelmValuesError)) as caught,
    ):
        chart.render(values, name=release)
    assert message in str(caught.value), caught.value


def test_helm_values_cli_writes_the_values_and_refuses_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "values.yaml"
    done = run_cli("launch", "helm-values", EXAMPLE, "--api", "pytorchjob", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "helm install gpt-h200-elastic deploy/helm/hpcpipe -n ml-training" in done.stdout
    values = yaml.safe_load(out.read_text())
    assert values["nodes"] == {"min": 30, "max": 32} and values["resources"]["gpu"]["count"] == 8
    assert values["image"]["digest"].startswith("sha256:")
    for args, key in (
        (["--set", "launch.k8s.nope=1"], "launch.k8s.nope"),
        (["--gpus-per-node", "-1"], "--gpus-per-node"),
        (["--nodes", "30:33", "--api", "pytorchjob"], "global_batch_size"),
        (["--api", "trainjob"], "elastic"),
    ):
        bad = tmp_path / "bad.yaml"
        refused = run_cli("launch", "helm-values", EXAMPLE, "-o", str(bad), *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert refused.stderr.count("\n") == 1 and key in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr and not bad.exists()


@pytest.mark.parametrize(
    ("image", "digest", "parts"),
    [
        ("ghcr.io/hpcpipe/hpcpipe:latest", None, ("ghcr.io/hpcpipe/hpcpipe", "latest", "")),
        ("registry.local:5000/hpcpipe", None, ("registry.local:5000/hpcpipe", "", "")),
        ("r:5000/x:1@sha256:ab", None, ("r:5000/x", "1", "sha256:ab")),
        ("r/x:1@sha256:ab", "sha256:cd", ("r/x", "1", "sha256:cd")),
    ],
)
def test_an_image_reference_splits_into_repository_tag_and_digest(
    image: str, digest: str | None, parts: tuple[str, str, str]
) -> None:
    assert split_image(image, digest) == parts


def test_helm_package_builds_the_chart_archive_offline(tmp_path: Path) -> None:
    archive = helm.package(str(CHART), destination=str(tmp_path))
    assert Path(archive).name == "hpcpipe-0.1.0.tgz"
    with helm.Chart.load(archive) as chart:  # the symlinked alert rules and dashboard went in
        files = {f["name"]: f["data"] for f in chart.files}
        assert files["files/alerts.yml"] == (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
        values = {"api": "pytorchjob", "metrics": {"port": 9400}, "monitoring": {"enabled": True}}
        assert "kind: PrometheusRule" in chart.render(values, name="x")["hpcpipe/templates/monitoring.yaml"]


def _notes(values: dict[str, Any]) -> str:
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name="smoke", namespace="default")
    return next(text for path, text in files.items() if path.endswith("NOTES.txt"))


def test_the_notes_say_where_the_run_directory_is() -> None:
    """With a checkpoints claim, NOTES.txt said the run directory was on it although the tiny
    preset writes to the relative `runs`, the pod's own disk."""
    claim = {"persistence": {"checkpoints": {"enabled": True}}}
    assert "runs, not under /checkpoints" in _notes({**claim, "config": "run: {name: tiny}\n"})
    on_claim = _notes({**claim, "config": "run: {name: tiny, out_dir: /checkpoints/runs}\n"})
    assert "(run.out_dir /checkpoints/runs) is on the claim smoke-checkpoints" in on_claim
    assert "stay on the pods' own disks" in _notes({"config": "run: {name: tiny}\n"})


def test_the_chart_refuses_labels_that_select_the_pods() -> None:
    """A user label overriding app.kubernetes.io/instance left the PodMonitor selecting nothing."""
    with pytest.raises(Exception, match=r"app\.kubernetes\.io/instance|propertyNames|labels"):
        _notes({"config": "run: {name: tiny}\n", "labels": {"app.kubernetes.io/instance": "other"}})


def test_the_templates_refuse_labels_that_select_the_pods_without_the_schema(tmp_path: Path) -> None:
    """With the schema skipped (helm install --skip-schema-validation), a user label replaced
    app.kubernetes.io/name or instance and the PodMonitor and hpcpipe jobs found no pod."""
    chart = shutil.copytree(CHART, tmp_path / "hpcpipe")  # the linked alert rules and dashboard as files
    (chart / "values.schema.json").unlink()
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance"):
        values = {"config": "run: {name: tiny}\n", "labels": {key: "other"}}
        with helm.Chart.load(str(chart)) as loaded, pytest.raises(helm.HelmRenderError) as caught:
            loaded.render(values, name="x")
        assert f'labels: "{key}" is set by hpcpipe' in str(caught.value), caught.value
