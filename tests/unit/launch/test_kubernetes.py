"""`hpcpipe launch k8s`: golden manifests for both Kubeflow APIs, model validation, bad input.

Regenerate the golden files after a deliberate change with
``HPCPIPE_UPDATE_GOLDEN=1 pytest tests/unit/launch/test_kubernetes.py``, and read the diff.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.helpers import run_cli

from hpcpipe.config import load_config, validate_config
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.launch.k8s_validate import validate_manifest
from hpcpipe.launch.kubernetes import render_k8s, to_yaml
from hpcpipe.train.environment import detect_environment

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "data" / "k8s"
SEED = str(ROOT / "examples" / "k8s" / "h200-elastic.yaml")
CASES: dict[str, tuple[str, list[str], str, bool]] = {
    # name: (config, overrides, api, with the hpcpipe-torch runtime)
    "seed-pytorchjob": (SEED, [], "pytorchjob", False),
    "seed-trainjob-runtime": (SEED, ["parallel.nnodes=32", "train.global_batch_size=4096"], "trainjob", True),
    "tiny-trainjob": (
        "tiny",
        [
            "parallel.nnodes=2",
            "launch.k8s.gpus_per_node=8",
            "train.global_batch_size=16",
            "train.micro_batch_size=1",
        ],
        "trainjob",
        False,
    ),
}


def _render(name: str) -> list[dict[str, Any]]:
    config, overrides, api, runtime = CASES[name]
    return render_k8s(load_config(config, overrides), api, runtime)  # type: ignore[arg-type]


def _without_config_text(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ConfigMap's config.yaml changes with every new config field; its round trip is tested
    on its own, the golden file keeps the manifests' structure."""
    docs = copy.deepcopy(docs)
    docs[0]["data"]["config.yaml"] = "<the job's config.yaml>"
    return docs


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_manifests_match_their_golden_file(name: str) -> None:
    text = to_yaml(_without_config_text(_render(name)))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("HPCPIPE_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs: HPCPIPE_UPDATE_GOLDEN=1 regenerates it"


def test_the_seed_renders_as_an_elastic_pytorchjob() -> None:
    _, job_doc = _render("seed-pytorchjob")
    spec = job_doc["spec"]
    assert spec["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "rdzvPort": 29400,
        "minReplicas": 30,
        "maxReplicas": 32,
        "maxRestarts": 3,
    }
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 32 and worker["restartPolicy"] == "OnFailure"  # not ExitCode: 75 resumes
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "pytorch" and container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "@sha256:" in container["image"]
    assert pod["initContainers"][0]["command"][1:4] == ["data", "stage", "--job"]
    # Guaranteed QoS: cpu and memory, requests equal to limits, on every container, init ones too
    # (the stage container had none, so the pod was Burstable).
    for each in [*pod["initContainers"], *pod["containers"]]:
        amounts = each["resources"]["limits"]
        assert {"cpu", "memory"} <= amounts.keys() and each["resources"]["requests"] == amounts, each["name"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"cephfs-datasets", "cephfs-checkpoints"}
    secret = next(e for e in container["env"] if e["name"] == "MLFLOW_TRACKING_PASSWORD")
    assert secret == {
        "name": "MLFLOW_TRACKING_PASSWORD",
        "valueFrom": {"secretKeyRef": {"key": "password", "name": "mlflow-credentials"}},
    }


def test_the_fsdp_flag_travels_in_the_configmap_and_round_trips() -> None:
    job = load_config(SEED)
    config_map, _ = render_k8s(job, "pytorchjob")
    carried = validate_config(yaml.safe_load(config_map["data"]["config.yaml"]))
    assert carried == job and carried.parallel.strategy == "fsdp"
    ddp = load_config(SEED, ["parallel.strategy=ddp"])
    assert "strategy: ddp" in render_k8s(ddp, "pytorchjob")[0]["data"]["config.yaml"]


def test_the_hpcpipe_runtime_restarts_only_after_a_preemption() -> None:
    _, runtime, train_job = _render("seed-trainjob-runtime")
    policy = runtime["spec"]["template"]["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 3
    assert policy["rules"][0]["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert policy["rules"][1]["action"] == "FailJobSet"
    job_spec = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    # The stage step too: evicted, it exits 75 (it died of SIGTERM, 143, and failed the job).
    rules = [rule["onExitCodes"] for rule in job_spec["podFailurePolicy"]["rules"]]
    assert [(r["containerName"], r["values"]) for r in rules] == [("node", [75]), ("stage", [75])]
    assert train_job["spec"]["runtimeRef"]["name"] == "hpcpipe-torch"
    assert train_job["spec"]["trainer"]["numNodes"] == 32


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_a_pod_outlives_the_preemption_checkpoint(api: str) -> None:
    """fault.preempt_grace_s reaches the agent (--grace: 30 s more for the step in flight) and the
    pod (15 s more for the agent's SIGKILL of what is left and its exit), so the kubelet's default
    30 s does not SIGKILL a checkpoint being written."""
    docs = render_k8s(load_config("tiny", ["fault.preempt_grace_s=300"]), api)  # type: ignore[arg-type]
    job = docs[1]
    if api == "trainjob":
        command = job["spec"]["trainer"]["command"]
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        pod = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    else:
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        command = pod["containers"][0]["command"]
    assert command[command.index("--grace") + 1] == "330"
    assert pod["terminationGracePeriodSeconds"] == 345


def test_the_runtime_stage_step_gets_the_config_even_without_a_cache() -> None:
    _, _, train_job = render_k8s(load_config("tiny"), "trainjob", with_runtime=True)
    patch = train_job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    stage_mounts = {m["mountPath"] for m in pod["initContainers"][0]["volumeMounts"]}
    assert "/etc/hpcpipe" in stage_mounts  # `data stage --job ... --if-configured` reads it


def test_the_pod_stage_step_lets_data_without_a_manifest_through() -> None:
    """A PyTorchJob pod's stage container, like the TrainJob runtime's, skips a recipe whose data
    have no file manifest (a generated set) instead of failing the pod before training."""
    cache = ["data.cache_dir=/mnt/nvme/c", "launch.k8s.cache_host_path=/mnt/nvme"]
    _, job = render_k8s(load_config("lora-fc-tiny", cache), "pytorchjob")
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (stage,) = pod["initContainers"]
    assert stage["command"][1:] == ["data", "stage", "--job", "/etc/hpcpipe/config.yaml", "--if-configured"]


@pytest.mark.parametrize(
    ("api", "override", "message"),
    [
        ("pytorchjob", "launch.k8s.tolerations=[{key: gpu, operater: Exists}]", "tolerations[0].operater"),
        ("trainjob", "launch.k8s.tolerations=[{key: gpu, operater: Exists}]", "tolerations[0].operater"),
        ("pytorchjob", "launch.k8s.tolerations=[{key: gpu, tolerationSeconds: soon}]", "expected int"),
        ("trainjob", "launch.k8s.tolerations=[{key: gpu, tolerationSeconds: soon}]", "valid integer"),
    ],
)
def test_a_wrong_field_is_rejected_by_the_models(api: str, override: str, message: str) -> None:
    job = load_config("tiny", [override])
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        render_k8s(job, api)  # type: ignore[arg-type]


def test_required_fields_and_enums_are_checked_too() -> None:
    _, job_doc = render_k8s(load_config("tiny"), "pytorchjob")
    del job_doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(ConfigError, match="`name`, must not be `None`"):
        validate_manifest(job_doc)
    _, train_job = render_k8s(load_config("tiny"), "trainjob")
    train_job["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(ConfigError, match="numNodes"):
        validate_manifest(train_job)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["parallel.nnodes=2:4"], "no elastic policy"),
        (["launch.k8s.cache_host_path=/mnt/nvme"], "needs data.cache_dir"),
        (["launch.k8s.checkpoint_pvc=ckpt"], "not under launch.k8s.checkpoint_mount"),
        (["launch.k8s.runs_pvc=runs"], "not under launch.k8s.runs_mount"),
        (
            ["launch.k8s.runs_pvc=r", "run.out_dir=/runs", "launch.k8s.checkpoint_pvc=c"],
            "point checkpoint.durable_dir",
        ),
        # Checkpoints on the pods' own disks, the claim mounted beside them; a path that only reads as on it.
        (
            ["launch.k8s.checkpoint_pvc=c", "run.out_dir=/checkpoints/r", "checkpoint.dir=/scratch"],
            "own disk",
        ),
        (
            ["launch.k8s.checkpoint_pvc=c", "run.out_dir=/checkpoints/r", "checkpoint.durable_dir=/x"],
            "own disk",
        ),
        (
            ["launch.k8s.checkpoint_pvc=c", "run.out_dir=/checkpoints/../tmp"],
            "not under launch.k8s.checkpoint",
        ),
        (["launch.k8s.gpus_per_node=2", "launch.k8s.nproc_per_node=4"], "ranks would share a GPU"),
        (["launch.k8s.memory=lots"], "not a Kubernetes quantity"),
        (["launch.k8s.cpu=-3"], "not a Kubernetes quantity"),
        (["launch.k8s.shm_size=huge"], "not a Kubernetes quantity"),
        (["launch.k8s.namespace=Bad_NS"], "DNS label"),
        (["launch.k8s.queue=my_queue!"], "label value"),
        (["launch.k8s.data_mount=relative"], "absolute"),
        # The PodMonitor and `hpcpipe jobs` select the pods by it: overridden, they found none.
        (['launch.k8s.labels={"app.kubernetes.io/instance": other}'], "set by hpcpipe"),
        # `hpcpipe run --on k8s` deletes a job of its name only when it carries its run's value.
        (['launch.k8s.labels={"hpcpipe.dev/run": other}'], "set by hpcpipe"),
        (["launch.k8s.secret_env={X: a b/key}"], "not a Secret's name/key"),
        (["launch.k8s.priority_class=high"], "priority_class"),
        (["launch.k8s.name=Bad_Name"], "launch.k8s.name"),
        (["launch.k8s.rdzv_port=29600"], "launch.k8s.rdzv_port 29600: a TrainJob"),  # was ignored
        (["launch.k8s.gpus_per_node=16"], "must be a multiple"),  # tiny's batch of 8 over 16 ranks
    ],
)
def test_inputs_that_cannot_run_are_named(overrides: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        render_k8s(load_config("tiny", ["train.micro_batch_size=1", *overrides]), "trainjob")


def test_a_secret_value_instead_of_a_reference_is_refused() -> None:
    with pytest.raises(ConfigError, match="secret-name/key"):
        load_config("tiny", ["launch.k8s.secret_env={HF_TOKEN: hf_abc123}"])


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "WANDB_API_KEY", "db.password", "AWS_SECRET_ACCESS_KEY", "Credential", "MAX_TOKEN"]
)
def test_a_secret_in_the_plain_environment_is_refused_when_rendered(name: str) -> None:
    """launch.k8s.env values go in plain text into the pod spec, the ConfigMap and config.yaml.
    Refused when a manifest is rendered (launch k8s, run --on k8s, helm-values, kfp), not when a
    config loads: a run's stored config.yaml with such a name must still load for eval and report."""
    job = load_config("tiny", [f"launch.k8s.env={{{name}: hf_abc123}}"])
    with pytest.raises(
        ConfigError, match=f"launch.k8s.env: {name} looks like a secret.*launch.k8s.secret_env"
    ):
        render_k8s(job)
    assert validate_config(job.to_dict()).launch.k8s.env == {name: "hf_abc123"}


def test_a_secret_in_the_slurm_environment_is_refused_when_a_manifest_is_rendered() -> None:
    """The ConfigMap (and a pipeline's config parameter) carry the whole config, the slurm
    section too: a k8s render that checked only launch.k8s.env wrote HF_TOKEN's value into it."""
    job = load_config("tiny", ["launch.slurm.env={HF_TOKEN: hf_SECRETVALUE}"])
    with pytest.raises(ConfigError, match=r"launch\.slurm\.env: HF_TOKEN looks like a secret"):
        render_k8s(job)


def test_names_of_paths_to_secrets_and_switches_are_plain_environment() -> None:
    """A path to a secret, or a switch, holds none: they were refused, with no way around."""
    names = [
        "TOKENIZERS_PARALLELISM",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
        "HF_TOKEN_PATH",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AZURE_FEDERATED_TOKEN_FILE",
        "VAULT_SECRET_DIR",
    ]
    env = "{" + ", ".join(f"{name}: '1'" for name in names) + "}"
    [_, train_job] = render_k8s(load_config("tiny", [f"launch.k8s.env={env}"]))
    assert "HF_HUB_DISABLE_IMPLICIT_TOKEN" in str(train_job)


def test_job_names_cut_or_rewritten_from_run_names_stay_apart() -> None:
    """run.name past 40 characters, or with characters a DNS label lacks, used to be cut and
    rewritten into one name for several runs (whose train steps then deleted each other's jobs)."""
    from hpcpipe.launch.kubernetes import dns_label

    long = "llama-8b-pretrain-h200-lr3e-4-warmup2000-seed"
    names = [dns_label(text) for text in (f"{long}0", f"{long}1", "exp_1", "exp.1", "Exp-1", "exp-1", "1st")]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40 for name in names)
    assert names[0].startswith("llama-8b-pretrain") and names[5] == "exp-1"  # a label stays as it is
    labels = [render_k8s(load_config("tiny", [f"run.name={n}"]))[1]["metadata"]["labels"] for n in ("a", "b")]
    assert labels[0]["hpcpipe.dev/run"] != labels[1]["hpcpipe.dev/run"]


def test_trainjob_worker_detection_from_pet_variables() -> None:
    env = {
        "PET_NNODES": "4",
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "train-node-0-0.train",
        "PET_MASTER_PORT": "29400",
        "JOB_COMPLETION_INDEX": "2",
    }
    found = detect_environment(env)
    assert (found.kind, found.rank, found.world_size, found.local_rank) == ("kubernetes", 2, 4, 0)
    assert (found.master_addr, found.master_port) == ("train-node-0-0.train", 29400)
    assert detect_environment(env | {"PET_NODE_RANK": "3"}).rank == 3
    with pytest.raises(UserError, match="hpcpipe launch agent"):
        detect_environment(env | {"PET_NPROC_PER_NODE": "8"})


def test_the_agent_takes_its_endpoint_from_pet_variables() -> None:
    from hpcpipe.cli.launch import _endpoint_from_env

    assert _endpoint_from_env({"PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}) == (
        "job-node-0-0.job:29500"
    )
    assert _endpoint_from_env({}) == "127.0.0.1:29400"


def test_cli_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    result = run_cli("launch", "k8s", "tiny", "--set", f"run.out_dir={tmp_path}", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["ConfigMap", "TrainJob"]
    assert not list(tmp_path.rglob("*.yaml"))
    written = run_cli("launch", "k8s", "tiny", "--set", f"run.out_dir={tmp_path}", "--api", "pytorchjob")
    assert written.returncode == 0, written.stderr
    assert [d["kind"] for d in yaml.safe_load_all((tmp_path / "tiny" / "k8s.yaml").read_text())] == [
        "ConfigMap",
        "PyTorchJob",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--submit"], "kubeconfig"),
        (["--api", "mpijob"], "--api mpijob"),
        (["--nodes", "0"], "--nodes 0"),
        (["--set", "launch.k8s.gpus_per_node=-1"], "launch.k8s.gpus_per_node"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "absent")}
    result = run_cli("launch", "k8s", "tiny", *args, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_exporter_ports_are_declared_for_the_podmonitor() -> None:
    sets = ["observe.prometheus.port=9400", "observe.prometheus.host=0.0.0.0", "train.micro_batch_size=1"]
    job = load_config("tiny", [*sets, "launch.k8s.gpus_per_node=4"])
    _, pytorch = render_k8s(job, "pytorchjob")
    pod = pytorch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports == {"c10d": 29400, **{f"metrics-{i}": 9400 + i for i in range(4)}}
    _, runtime, _ = render_k8s(job, "trainjob", with_runtime=True)
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [p["name"] for p in node["containers"][0]["ports"]] == [f"metrics-{i}" for i in range(4)]
    # deploy/k8s/podmonitor.yaml selects these pods and keeps exactly these ports.
    monitor = yaml.safe_load((ROOT / "deploy" / "k8s" / "podmonitor.yaml").read_text())
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    (keep,) = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert [name for name in ports if re.fullmatch(keep["regex"], name)] == [f"metrics-{i}" for i in range(4)]
    # The targets' job label is the pods' label value: the one the HpcpipeRankDown alert selects.
    alerts = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    assert f'up{{job="{pod["metadata"]["labels"][monitor["spec"]["jobLabel"]]}"}}' in alerts


@pytest.mark.parametrize(
    ("overrides", "api", "message"),
    [
        (["observe.prometheus.port=9400"], "pytorchjob", "cannot reach a pod's loopback"),
        (["observe.prometheus.port=9400", "observe.prometheus.host=::"], "trainjob", "container ports"),
        # The exporters' ports ran over the rendezvous port: two listeners on one port in one pod.
        (
            ["observe.prometheus.port=29399", "observe.prometheus.host=::", "launch.k8s.gpus_per_node=2"],
            "pytorchjob",
            "observe.prometheus.port 29399: the exporters' ports 29399-29400 .* rendezvous port 29400",
        ),
        (
            [
                "observe.prometheus.port=29500",
                "observe.prometheus.host=::",
                "launch.k8s.runtime=hpcpipe-torch",
            ],
            "trainjob",
            "rendezvous port 29500",
        ),
    ],
)
def test_an_exporter_a_pod_cannot_expose_is_named(overrides: list[str], api: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_k8s(load_config("tiny", ["train.micro_batch_size=1", *overrides]), api)  # type: ignore[arg-type]


def test_a_trainjob_on_the_shared_runtime_says_what_it_leaves_to_it() -> None:
    """Without --runtime, the priority class and the metrics ports were dropped without a word."""
    from hpcpipe.launch.kubernetes import runtime_note

    job = load_config("tiny", ["launch.k8s.runtime=hpcpipe-torch", "launch.k8s.priority_class=high"])
    note = runtime_note(job, "trainjob", with_runtime=False)
    assert note is not None and "launch.k8s.priority_class applies only as that runtime has it" in note
    assert runtime_note(job, "trainjob", with_runtime=True) is None
    assert runtime_note(load_config("tiny"), "trainjob", False) is None  # torch-distributed has no stage step
    # The stage step keeps the image and command of whoever installed the runtime (a TrainJob's
    # container patch cannot set an image): said for every job on it, not only a changed one.
    plain = runtime_note(load_config("tiny", ["launch.k8s.runtime=hpcpipe-torch"]), "trainjob", False)
    assert plain is not None and "stage init step runs the image and command" in plain
    assert "launch.k8s.image" in plain and "priority_class" not in plain


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_pull_secrets_reach_the_pods_of_either_api(api: str) -> None:
    """A private registry: the pods had no way to pull the image but the service account's secrets."""
    _, doc = render_k8s(load_config("tiny", ["launch.k8s.image_pull_secrets=[regcred]"]), api)  # type: ignore[arg-type]
    if api == "trainjob":
        [patch] = doc["spec"]["runtimePatches"]
        pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"
        ]
    else:
        pod = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    with pytest.raises(ConfigError, match="not a Secret's name"):
        load_config("tiny", ["launch.k8s.image_pull_secrets=[Reg_Cred]"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('launch.k8s.labels={team: "ml platform"}', "not a label value"),
        ('launch.k8s.labels={"bad key!": x}', "not a Kubernetes key"),
        ('launch.k8s.node_selector={"gpu type": a100}', "not a Kubernetes key"),
        ('launch.k8s.annotations={"a b": x}', "not a Kubernetes key"),
        ("launch.k8s.data_pvc=My_PVC", "not an object name"),
        ("launch.k8s.service_account=Bad_SA", "not an object name"),
        ("launch.k8s.priority_class=High", "not an object name"),
        ('launch.k8s.extra_resources={"rdma/ib": 0}', "not an amount"),
        ('launch.k8s.extra_resources={"nvidia.com/gpu": 2}', "has its own key"),
        ('launch.k8s.env={"1BAD=": x}', "not an environment variable name"),
    ],
)
def test_fields_the_api_server_would_refuse_are_refused_at_load(override: str, message: str) -> None:
    """The rendered manifest passed the offline check and was refused at submit (or, for
    extra_resources, silently replaced the GPU count)."""
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", [override])


def test_qualified_keys_and_extended_resources_render() -> None:
    job = load_config(
        "tiny",
        [
            'launch.k8s.labels={"example.com/team": ml-infra}',
            'launch.k8s.node_selector={"nvidia.com/gpu.product": NVIDIA-H100-80GB-HBM3}',
            'launch.k8s.extra_resources={"rdma/ib": 1}',
            'launch.k8s.annotations={"k8s.v1.cni.cncf.io/networks": "net-a, net-b"}',
        ],
    )
    assert job.launch.k8s.extra_resources == {"rdma/ib": 1}
    render_k8s(job, "pytorchjob")
