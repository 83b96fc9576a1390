"""`launch k8s --submit` and `jobs status|logs|cancel` through the real ``kubernetes`` client,
against the loopback stand-in for the API server (tests/integration/kube_api.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli
from tests.integration.kube_api import KubeApi

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
TOKEN = "s3cr3t-bearer-token"


def _cli(kubeconfig: Path, *args: str, cwd: Path) -> tuple[int, str, str]:
    result = run_cli(*args, "--kubeconfig", str(kubeconfig), cwd=cwd)
    assert TOKEN not in result.stdout + result.stderr  # credentials never reach the output
    return result.returncode, result.stdout, result.stderr


def test_submit_follow_and_cancel_a_trainjob(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "tiny"
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        sets = ["--set", f"run.out_dir={tmp_path / 'runs'}", "--set", "launch.k8s.namespace=ml"]
        code, out, err = _cli(
            kubeconfig, "launch", "k8s", "tiny", *sets, "--submit", "--runtime", cwd=tmp_path
        )
        assert code == 0, err
        assert {key[:2] for key in api.objects} == {
            ("configmaps", "ml"),
            ("clustertrainingruntimes", ""),
            ("trainjobs", "ml"),
        }
        assert set(api.tokens) == {f"Bearer {TOKEN}"}
        assert json.loads((run_dir / "k8s_job.json").read_text())["kind"] == "TrainJob"

        # A second job finds the shared runtime as it would render it (409, left as it is) but may
        # not reuse the name; one whose runtime differs may not replace it under the others' jobs.
        code, _, err = _cli(kubeconfig, "launch", "k8s", "tiny", *sets, "--submit", "--runtime", cwd=tmp_path)
        assert code == 2 and "already exists" in err and len(err.strip().splitlines()) == 1
        runtime = ("clustertrainingruntimes", "", "hpcpipe-torch")
        before = json.dumps(api.objects[runtime], sort_keys=True)
        other = [*sets, "--set", "launch.k8s.priority_class=low", "--set", "run.name=other"]
        code, _, err = _cli(
            kubeconfig, "launch", "k8s", "tiny", *other, "--submit", "--runtime", cwd=tmp_path
        )
        assert code == 2 and "exists with other settings" in err and len(err.strip().splitlines()) == 1
        assert json.dumps(api.objects[runtime], sort_keys=True) == before
        assert not any(method == "PUT" for method, _ in api.requests)

        api.objects[("trainjobs", "ml", "tiny")]["status"] = {
            "conditions": [{"type": "Created", "status": "True", "reason": "JobSetCreated", "message": ""}]
        }
        api.add_pod(
            "ml", "tiny-node-0-0-abcde", {"jobset.sigs.k8s.io/jobset-name": "tiny"}, "step 1\nstep 2\n"
        )
        api.add_pod("ml", "other-node-0-0-xyz", {"jobset.sigs.k8s.io/jobset-name": "other"}, "")
        code, out, err = _cli(kubeconfig, "jobs", "status", str(run_dir), "--json", "-", cwd=tmp_path)
        assert code == 0, err
        state = json.loads(out)
        assert state["conditions"][0]["type"] == "Created"
        assert state["pods"] == [
            {"pod": "tiny-node-0-0-abcde", "phase": "Running", "node": "gpu-node-1", "restarts": 1}
        ]

        code, out, err = _cli(kubeconfig, "jobs", "logs", str(run_dir), "--tail", "1", cwd=tmp_path)
        assert code == 0 and "step 2" in out and "step 1" not in out, err

        code, out, err = _cli(kubeconfig, "jobs", "cancel", str(run_dir), cwd=tmp_path)
        assert code == 0, err
        assert ("trainjobs", "ml", "tiny") not in api.objects and (
            "configmaps",
            "ml",
            "tiny-config",
        ) not in api.objects


def test_submit_an_elastic_pytorchjob_and_a_missing_job_is_one_line(tmp_path: Path) -> None:
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        sets = ["--set", f"run.out_dir={tmp_path / 'runs'}", "--set", "train.micro_batch_size=1"]
        code, _, err = _cli(
            kubeconfig,
            "launch",
            "k8s",
            "tiny",
            *sets,
            "--api",
            "pytorchjob",
            "--nodes",
            "1:2",
            "--submit",
            cwd=tmp_path,
        )
        assert code == 0, err
        job = api.objects[("pytorchjobs", "default", "tiny")]
        assert (
            job["spec"]["elasticPolicy"]["minReplicas"] == 1
            and job["spec"]["elasticPolicy"]["maxReplicas"] == 2
        )
        # The run's job ended and someone submitted another of the same name: cancel leaves it.
        run_dir = str(tmp_path / "runs" / "tiny")
        job["metadata"]["uid"] = "a-colleagues-job"
        code, _, err = _cli(kubeconfig, "jobs", "cancel", run_dir, cwd=tmp_path)
        assert code == 2 and "is another job now" in err and len(err.strip().splitlines()) == 1
        assert ("pytorchjobs", "default", "tiny") in api.objects and (
            "configmaps",
            "default",
            "tiny-config",
        ) in api.objects
        del api.objects[("pytorchjobs", "default", "tiny")]
        code, _, err = _cli(kubeconfig, "jobs", "status", run_dir, cwd=tmp_path)
        assert code == 2 and "not found" in err and "Traceback" not in err


def test_a_refused_job_leaves_no_configmap_behind(tmp_path: Path) -> None:
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        api.objects[("trainjobs", "default", "tiny")] = {"metadata": {"name": "tiny"}}
        code, _, err = _cli(
            kubeconfig, "launch", "k8s", "tiny", "--set", f"run.out_dir={tmp_path}", "--submit", cwd=tmp_path
        )
        assert code == 2 and "already exists" in err and "jobs cancel" in err
        assert ("configmaps", "default", "tiny-config") not in api.objects
        assert not (tmp_path / "tiny" / "k8s_job.json").exists()


def test_a_configmap_left_by_a_deleted_job_is_named(tmp_path: Path) -> None:
    """`kubectl delete trainjob` keeps the ConfigMap: the refusal names it, not a job that is gone."""
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        api.objects[("configmaps", "default", "tiny-config")] = {"metadata": {"name": "tiny-config"}}
        code, _, err = _cli(
            kubeconfig, "launch", "k8s", "tiny", "--set", f"run.out_dir={tmp_path}", "--submit", cwd=tmp_path
        )
        assert code == 2 and "kubectl delete configmap tiny-config -n default" in err, err
        assert "jobs cancel" not in err and len(err.strip().splitlines()) == 1


def test_a_submit_keeps_the_name_of_the_job_its_run_recorded(tmp_path: Path) -> None:
    """A run whose job was created as tiny-gpt (an older hpcpipe, here launch.k8s.name) is
    tiny-gpt-db11a5 by run.name now: `launch k8s --submit` created that second job beside the
    running one, both writing the run directory, and overwrote k8s_job.json. It keeps the
    recorded name: refused while that job runs, the record untouched."""
    run_dir = tmp_path / "tiny_gpt"
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "run.name=tiny_gpt"]
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        older = [*sets, "--set", "launch.k8s.name=tiny-gpt"]
        code, _, err = _cli(kubeconfig, "launch", "k8s", "tiny", *older, "--submit", cwd=tmp_path)
        assert code == 0, err
        record = (run_dir / "k8s_job.json").read_text()
        code, _, err = _cli(kubeconfig, "launch", "k8s", "tiny", *sets, "--submit", cwd=tmp_path)
        assert code == 2 and "already exists" in err, err
        assert [key[2] for key in api.objects if key[0] == "trainjobs"] == ["tiny-gpt"]
        assert (run_dir / "k8s_job.json").read_text() == record


def test_a_submit_of_the_other_api_neither_takes_its_name_nor_says_delete_its_configmap(
    tmp_path: Path,
) -> None:
    """A TrainJob recorded under an older name (tiny-gpt): `launch k8s --api pytorchjob --submit`
    took that name too, and, refused for the ConfigMap they would share, said no PyTorchJob of
    that name exists: delete the ConfigMap (the running TrainJob's). It takes run.name's name now;
    a TrainJob holding that name too is named as a job, not its ConfigMap left over. While the
    recorded job runs, a submit of the other API is refused: two jobs would train into one run
    directory."""
    sets = ["--set", f"run.out_dir={tmp_path}", "--set", "run.name=tiny_gpt"]
    submit = ["launch", "k8s", "tiny", *sets, "--api", "pytorchjob", "--submit"]
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        older = [*sets, "--set", "launch.k8s.name=tiny-gpt"]
        code, _, err = _cli(kubeconfig, "launch", "k8s", "tiny", *older, "--submit", cwd=tmp_path)
        assert code == 0, err
        code, _, err = _cli(kubeconfig, *submit, cwd=tmp_path)  # the TrainJob still runs: refused
        assert code == 2 and "this run's recorded job, is still there" in err, err
        assert not [key for key in api.objects if key[0] == "pytorchjobs"]
        for plural in ("trainjobs", "configmaps"):  # `hpcpipe jobs cancel`: gone
            api.objects.pop(
                next(key for key in api.objects if key[0] == plural and key[2].startswith("tiny-gpt"))
            )
        code, _, err = _cli(kubeconfig, *submit, cwd=tmp_path)
        assert code == 0, err
        assert [key[2] for key in api.objects if key[0] == "pytorchjobs"] == ["tiny-gpt-db11a5"]
        for plural in ("pytorchjobs", "configmaps"):  # kubectl delete: gone
            api.objects.pop(next(key for key in api.objects if key[0] == plural and "db11a5" in key[2]))
        code, _, err = _cli(kubeconfig, "launch", "k8s", "tiny", *sets, "--submit", cwd=tmp_path)
        assert code == 0, err  # a TrainJob tiny-gpt-db11a5, its ConfigMap the one a PyTorchJob would use
        code, _, err = _cli(kubeconfig, *submit, cwd=tmp_path)
        assert code == 2 and "is still there" in err and "delete configmap" not in err, err


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    with KubeApi() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
    # The server has stopped: nothing listens on its port any more.
    code, _, err = _cli(
        kubeconfig, "launch", "k8s", "tiny", "--set", f"run.out_dir={tmp_path}", "--submit", cwd=tmp_path
    )
    assert code == 2 and "cannot reach the Kubernetes API server" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
