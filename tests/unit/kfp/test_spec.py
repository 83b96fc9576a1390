"""``hpcpipe launch kfp``: the real kfp SDK (2.17.3, in its own environment from the lock: make
kfp-env) compiles the job's DAG; the IR YAML is checked for the edges, each step's command, the
claims and the Katib branch. The command finds that environment by itself."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.helpers import run_cli

from hpcpipe.errors import ConfigError, UserError
from hpcpipe.kfp import sdk
from hpcpipe.kfp.sdk import KFP_PYTHON_VAR, KFP_REQUIREMENTS

ROOT = Path(__file__).resolve().parents[3]
KFP_PYTHON = ROOT / ".venv-kfp" / "bin" / "python"
EXAMPLE = str(ROOT / "examples" / "k8s" / "h200-elastic.yaml")
STEPS = ["prepare", "stage", "train", "evaluate", "export", "register", "report"]
needs_kfp = pytest.mark.skipif(
    not KFP_PYTHON.is_file(), reason="no .venv-kfp (make kfp-env builds it from uv.lock)"
)
# The example as a pipeline: the prepared data on the datasets claim, and a small search space.
SETS = [
    "data.prepared_dir=/data/prepared",
    "hpo.space={train.lr: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}}",
]


def _compile(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path / "pipeline.yaml"
    sets = [a for s in SETS for a in ("--set", s)]
    env = {KFP_PYTHON_VAR: str(KFP_PYTHON)}
    done = run_cli("launch", "kfp", EXAMPLE, "--api", "pytorchjob", *sets, "-o", str(out), *extra, env=env)
    assert done.returncode == 0, done.stderr
    pipeline, platform = yaml.safe_load_all(out.read_text())
    return pipeline, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def _command(pipeline: dict[str, Any], task: str, dag: dict[str, Any] | None = None) -> list[str]:
    component = (dag or pipeline["root"]["dag"])["tasks"][task]["componentRef"]["name"]
    executor = pipeline["components"][component]["executorLabel"]
    container = pipeline["deploymentSpec"]["executors"][executor]["container"]
    return [*container.get("command", []), *container.get("args", [])]


@needs_kfp
def test_the_pipeline_is_hpcpipes_dag_with_one_hpcpipe_run_per_step(tmp_path: Path) -> None:
    pipeline, executors = _compile(tmp_path)
    tasks = pipeline["root"]["dag"]["tasks"]
    assert sorted(tasks) == sorted(STEPS)
    from hpcpipe.pipeline.steps import STEPS as ENGINE_STEPS

    previous: list[str] = []
    for step in ENGINE_STEPS:  # KFP's edges are the engine's (one step at a time: they share lineage.json)
        assert sorted(tasks[step.name].get("dependentTasks", [])) == sorted({*step.after, *previous}), (
            step.name
        )
        previous = [step.name]
        artifacts = tasks[step.name].get("inputs", {}).get("artifacts", {})
        assert {a: v["taskOutputArtifact"]["producerTask"] for a, v in artifacts.items()} == {
            up: up for up in step.after
        }
        command = _command(pipeline, step.name)
        run = command[command.index("hpcpipe") :]
        assert run[:5] == ["hpcpipe", "run", "/tmp/hpcpipe/config.yaml", "--only", step.name]
        assert "--record" in run and run[run.index("--record") + 1].startswith(
            "{{$.outputs.artifacts['record']"
        )
        assert run.count("--upstream") == len(step.after)
        assert run[5:9] == ["--on", "k8s", "--api", "pytorchjob"]
    for executor in pipeline["deploymentSpec"]["executors"].values():  # check_compiled reads it
        env = {e["name"]: e["value"] for e in executor["container"].get("env", [])}
        assert json.loads(env["HPCPIPE_KFP_COMPILED"])["image"] == executor["container"]["image"]
    outputs = pipeline["components"]["comp-train"]["outputDefinitions"]["artifacts"]
    assert outputs["record"]["artifactType"]["schemaTitle"] == "system.Model"
    config = pipeline["root"]["inputDefinitions"]["parameters"]["config"]
    assert yaml.safe_load(config["defaultValue"])["run"]["name"] == "gpt-h200-elastic"
    for executor in executors.values():  # every step mounts both claims and gets the secret
        assert {m["constant"]: m["mountPath"] for m in executor["pvcMount"]} == {
            "cephfs-datasets": "/data",
            "cephfs-checkpoints": "/checkpoints",
        }
        assert executor["secretAsEnv"][0]["keyToEnv"] == [
            {"secretKey": "password", "envVar": "MLFLOW_TRACKING_PASSWORD"}
        ]


@needs_kfp
def test_the_katib_branch_runs_before_train_and_feeds_it(tmp_path: Path) -> None:
    pipeline, _ = _compile(tmp_path, "--katib", "--workers", "3")
    tasks = pipeline["root"]["dag"]["tasks"]
    branches = [name for name in tasks if name.startswith("condition-branches")]
    assert len(branches) == 1 and branches[0] in tasks["train"]["dependentTasks"]
    assert tasks[branches[0]]["dependentTasks"] == ["stage"]
    params = tasks["train"]["inputs"]["artifacts"]["params"]["taskOutputArtifact"]
    assert params["producerTask"] == branches[0]
    assert pipeline["root"]["inputDefinitions"]["parameters"]["tune"]["defaultValue"] is True
    branch = pipeline["components"][tasks[branches[0]]["componentRef"]["name"]]["dag"]["tasks"]
    conditions = {name: t["triggerPolicy"]["condition"] for name, t in branch.items()}
    assert any("tune" in c and not c.startswith("!") for c in conditions.values())
    search = next(name for name in branch if not conditions[name].startswith("!"))
    search_dag = pipeline["components"][branch[search]["componentRef"]["name"]]["dag"]
    katib = _command(pipeline, "katib", search_dag)
    run = katib[katib.index("hpcpipe") :]
    assert run[:5] == ["hpcpipe", "hpo", "launch", "katib", "/tmp/hpcpipe/config.yaml"]
    assert run[run.index("--workers") + 1] == "3" and "--submit" in run and "--wait" in run
    for step in ("train", "evaluate", "export", "register", "report"):  # all read the tuned config
        command = _command(pipeline, step)
        assert command[command.index("--params") + 1].startswith("{{$.inputs.artifacts['params']"), step
    assert "--params" not in _command(pipeline, "prepare")
    study = run[run.index("hpo.study=gpt-h200-elastic-hpo")]  # its ConfigMap is not the train job's
    assert study and "parallel.nnodes=1" in run


def test_long_run_names_give_their_katib_steps_two_study_names() -> None:
    """The study name was the train job's name cut to 36 characters, which cut the hash that keeps
    two long run names apart: two runs' Experiments shared one name."""
    from hpcpipe.config import load_config
    from hpcpipe.kfp.spec import _katib_sets
    from hpcpipe.launch.kubernetes import job_name

    long = "llama-8b-pretrain-h200-lr3e-4-warmup2000-seed"
    jobs = [load_config("tiny", [f"run.name={long}{seed}"]) for seed in (0, 1)]
    studies = [_katib_sets(job)[1] for job in jobs]
    assert studies[0] != studies[1] and len(studies[0]) <= len("hpo.study=") + 40
    assert {s.removeprefix("hpo.study=") for s in studies}.isdisjoint(job_name(job) for job in jobs)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--katib", "--set", "hpo.space={}"], "hpo.space"),
        (["--set", "launch.k8s.checkpoint_pvc=null"], "launch.k8s.runs_pvc (or checkpoint_pvc)"),
        (["--set", "data.prepared_dir=/elsewhere"], "data.prepared_dir"),
        (["--set", "data.prepared_dir=/data/../scratch/prepared"], "data.prepared_dir"),  # it compiled
        (["--set", "checkpoint.dir=/local-nvme/ckpt"], "checkpoint.dir"),
        (["--api", "trainjob"], "elastic"),
        (["--set", "launch.k8s.nope=1"], "launch.k8s.nope"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], key: str) -> None:
    out = tmp_path / "pipeline.yaml"
    sets = [a for s in SETS for a in ("--set", s)]
    api = [] if "--api" in args else ["--api", "pytorchjob"]
    env = {KFP_PYTHON_VAR: str(KFP_PYTHON)} if KFP_PYTHON.is_file() else {}
    done = run_cli("launch", "kfp", EXAMPLE, *api, *sets, *args, "-o", str(out), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and key in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@needs_kfp
def test_the_projects_own_kfp_environment_is_found_with_nothing_set(tmp_path: Path) -> None:
    """After `make install` and `make kfp-env`: no variable, no uv, and the pipeline compiles."""
    out = tmp_path / "p.yaml"
    sets = [a for s in SETS for a in ("--set", s)]
    env = {KFP_PYTHON_VAR: "", "PATH": "/usr/bin:/bin"}  # no uv on this PATH
    done = run_cli("launch", "kfp", EXAMPLE, "--api", "pytorchjob", *sets, "-o", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load_all(out.read_text())


def test_kfp_env_is_looked_for_beside_the_running_venv_and_in_the_checkout() -> None:
    roots = sdk.project_roots()
    assert ROOT in roots  # this checkout, where `make kfp-env` builds .venv-kfp
    if sys.prefix != sys.base_prefix:
        assert Path(sys.prefix).parent in roots


def test_a_kfp_env_under_a_root_is_used_before_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / ".venv-kfp" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    monkeypatch.delenv(KFP_PYTHON_VAR, raising=False)
    assert sdk.kfp_interpreter([tmp_path / "elsewhere", tmp_path]) == [str(python)]
    monkeypatch.setenv(KFP_PYTHON_VAR, "/usr/bin/python3")  # the variable wins
    assert sdk.kfp_interpreter([tmp_path]) == ["/usr/bin/python3"]


def test_without_kfp_the_error_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KFP_PYTHON_VAR, "")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no uv on this PATH
    monkeypatch.setattr(sdk, "project_roots", lambda: [tmp_path])  # no .venv-kfp there
    with pytest.raises(UserError) as raised:
        sdk.compile_pipeline({}, tmp_path / "p.yaml")
    message = str(raised.value)
    assert "make kfp-env" in message and "kfp==2.17.3" in message and KFP_PYTHON_VAR in message
    assert "\n" not in message and not (tmp_path / "p.yaml").exists()


def test_the_lock_group_pins_what_the_compiler_asks_for() -> None:
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert tuple(groups["kfp"]) == KFP_REQUIREMENTS


def test_a_step_refuses_a_config_parameter_that_changes_what_was_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps' pods have the compiled image, claims and env; the train job took the config's:
    a run submitted with another launch.k8s.image ran its steps on two images."""
    from hpcpipe.config import load_config
    from hpcpipe.kfp.spec import COMPILED_VAR, check_compiled, pipeline_spec

    job = load_config(EXAMPLE, SETS)
    compiled = pipeline_spec(job, "pytorchjob")["env"][COMPILED_VAR]
    monkeypatch.setenv(COMPILED_VAR, compiled)
    check_compiled(job)  # the compiled config, or one that changes only what the steps read
    check_compiled(load_config(EXAMPLE, [*SETS, "train.steps=7"]))
    changes = {
        "launch.k8s.image=registry/other:2": "launch.k8s.image",
        "launch.k8s.checkpoint_pvc=other-claim": "launch.k8s.data_pvc/checkpoint_pvc/runs_pvc",
        "launch.k8s.env={A: b}": "launch.k8s.env",
    }
    for change, key in changes.items():
        with pytest.raises(ConfigError, match=f"^{key}: the pipeline parameter 'config' changes it"):
            check_compiled(load_config(EXAMPLE, [*SETS, change]))
    config = tmp_path / "config.yaml"
    config.write_text(load_config(EXAMPLE, [*SETS, "launch.k8s.image=registry/other:2"]).to_yaml())
    env = {COMPILED_VAR: compiled}
    for argv in (
        ["run", str(config), "--only", "prepare", "--on", "k8s"],
        ["hpo", "launch", "katib", str(config)],
    ):
        done = run_cli(*argv, env=env)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "launch.k8s.image" in done.stderr and "Traceback" not in done.stderr
