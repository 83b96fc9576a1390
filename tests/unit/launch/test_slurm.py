"""`hpcpipe launch slurm`: the rendered sbatch scripts (golden files, shellcheck) and bad input.

Regenerate the golden files after a deliberate template change with
``HPCPIPE_UPDATE_GOLDEN=1 pytest tests/unit/launch/test_slurm.py``, and read the diff.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from tests.helpers import run_cli

from hpcpipe.config import load_config
from hpcpipe.errors import ConfigError
from hpcpipe.launch.slurm import SlurmSubmission, render_sbatch
from hpcpipe.sweep import plan_points

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "slurm"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
SEED_ENV = "launch.slurm.env={NCCL_IB_HCA: 'mlx5_0,mlx5_1', NCCL_SOCKET_IFNAME: ib0, NCCL_DEBUG: WARN}"
CASES = {
    "two-nodes-8-gpus": [
        "parallel.nnodes=2",
        "launch.slurm.gpus_per_node=8",
        "launch.slurm.cpus_per_task=64",
        "launch.slurm.mem=480G",
        "launch.slurm.partition=gpu",
        "launch.slurm.account=ml-infra",
        "launch.slurm.qos=high",
        "launch.slurm.constraint=h100",
        "launch.slurm.exclusive=true",
        "launch.slurm.time=2-00:00:00",
        SEED_ENV,
        "launch.slurm.setup=['module load cuda/12.4', 'source /opt/venv/bin/activate']",
    ],
    "elastic-cpu": [
        "parallel.nnodes=1:2",
        "parallel.nproc=2",
        "launch.slurm.env={GLOO_SOCKET_IFNAME: veth1}",
    ],
    "apptainer-staged": [
        "parallel.nnodes=4",
        "launch.slurm.gpus_per_node=4",
        "launch.slurm.container=/shared/images/hpcpipe.sif",
        "launch.slurm.container_binds=[/scratch, /lustre/datasets, /local/nvme]",
        "data.cache_dir=/local/nvme/hpcpipe-cache",
    ],
    # observe.profile.tool (`launch slurm --profile`): the agents start the profiled ranks under the tool.
    "nsys-profile": [
        "parallel.nnodes=2",
        "launch.slurm.gpus_per_node=4",
        "train.global_batch_size=32",
        "launch.slurm.container=/shared/images/hpcpipe.sif",
        "observe.profile.tool=nsys",
        "observe.profile.start_step=50",
    ],
    "ncu-profile": [
        "launch.slurm.gpus_per_node=8",
        "train.global_batch_size=32",
        "observe.profile.tool=ncu",
        "observe.profile.ncu.launch_count=5",
    ],
}


def _render(name: str) -> str:
    job = load_config("tiny", ["run.out_dir=/scratch/runs", f"run.name={name}", *CASES[name]])
    return render_sbatch(SlurmSubmission([job], script_dir=job.run_dir))


def _render_array() -> str:
    grid = {"train.lr": [1e-3, 3e-3], "run.seed": [0]}
    points = plan_points("tiny", ["launch.slurm.signal=TERM"], grid, Path("/scratch/runs/sweep-tiny"))
    sweep_dir = Path("/scratch/runs/sweep-tiny")
    return render_sbatch(SlurmSubmission([p.job for p in points], script_dir=sweep_dir, sweep_dir=sweep_dir))


def _check_golden(name: str, text: str) -> None:
    text = re.sub(r"hpcpipe \d+\.\d+\.\d+\S*", "hpcpipe VERSION", text)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("HPCPIPE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; see the module docstring to regenerate"


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_matches_its_golden_file(name: str) -> None:
    _check_golden(name, _render(name))


def test_a_grid_renders_one_array_task_per_point() -> None:
    text = _render_array()
    _check_golden("array", text)
    assert "#SBATCH --array=0-1" in text and "slurm-%A_%a.out" in text
    assert text.count("/config.yaml") == 2 and "launch collect" in text


@pytest.mark.parametrize("text", [*(_render(n) for n in sorted(CASES)), _render_array()])
def test_rendered_scripts_are_shellcheck_clean_and_signal_every_task(text: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.run(
        [str(SHELLCHECK), str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout
    signal = re.search(r"^#SBATCH --signal=(\S+)$", text, re.M)
    assert signal is not None and not signal.group(1).startswith("B:")
    for option in ("--requeue", "--open-mode=append", "--ntasks-per-node=1"):
        assert f"#SBATCH {option}\n" in text
    assert "scontrol requeue" in text and "SLURM_RESTART_COUNT" in text


def test_a_profiled_run_exports_nsys_summaries_after_the_job_step(tmp_path: Path) -> None:
    """`--profile nsys` sets observe.profile.tool; the script then runs `nsys stats` on every
    rank's report (inside the image, like hpcpipe) before its exit-code logic; ncu has no stats."""
    out = f"run.out_dir={tmp_path}/runs"
    proc = run_cli("launch", "slurm", "tiny", "--set", out, "--profile", "nsys", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "observe.profile.tool=nsys" in proc.stdout and "profile/nsys/*.nsys-rep; do" in proc.stdout
    text = _render("nsys-profile")
    stats = "apptainer exec --nv /shared/images/hpcpipe.sif nsys stats --report nvtx_sum,cuda_gpu_kern_sum"
    assert stats in text and text.index(stats) < text.index('if [ "$code" -eq 75 ]')
    assert "nsys stats" not in _render("ncu-profile") and "profile/ncu" in _render("ncu-profile")
    assert "profile/" not in _render("two-nodes-8-gpus")  # no observe.profile.tool: nothing added


def test_only_an_elastic_run_lets_the_step_survive_a_lost_node() -> None:
    assert "srun --kill-on-bad-exit=1 " in _render("two-nodes-8-gpus")
    assert "srun --kill-on-bad-exit=0 --no-kill " in _render("elastic-cpu")
    # The allocation too: a DOWN node revoked the whole job, whatever the step asked.
    assert "#SBATCH --no-kill\n" in _render("elastic-cpu") and "#SBATCH --no-kill" not in _render(
        "two-nodes-8-gpus"
    )


def test_each_job_step_asks_for_the_cpus_and_odd_names_and_paths_stay_one_value(tmp_path: Path) -> None:
    """Slurm 22.05/23.02 do not pass sbatch's --cpus-per-task to srun: the agent and its workers
    were bound to one CPU. A space split #SBATCH --job-name; a % in a folder was a pattern."""
    text = _render("two-nodes-8-gpus")
    assert "#SBATCH --cpus-per-task=64" in text and "--ntasks-per-node=1 --cpus-per-task=64 \\\n" in text
    job = load_config("tiny", [f"run.out_dir={tmp_path}/my%runs", "run.name=my run"])
    script = render_sbatch(SlurmSubmission([job], script_dir=job.run_dir))
    assert '#SBATCH --job-name="my run"\n' in script
    assert f'#SBATCH --output="{tmp_path}/my%%runs/my run/slurm-%j.out"\n' in script


@pytest.mark.parametrize(
    ("sets", "grid", "says"),
    [
        (["fault.preempt_grace_s=600"], [], "launch.slurm.signal_grace_s 120: the agents wait up to 630 s"),
        ([], ["parallel.nnodes=[1,2]"], "--grid over parallel.nnodes"),
        ([], ["launch.slurm.time=[00:10:00,02:00:00]"], "--grid over launch"),
        (["launch.slurm.hpcpipe=hpcpipe\ntouch x"], [], "launch.slurm.hpcpipe"),
        (["hpo.storage=journal:/x\ntouch x"], [], "hpo.storage"),
    ],
)
def test_a_script_that_would_not_run_as_configured_is_refused(
    tmp_path: Path, sets: list[str], grid: list[str], says: str
) -> None:
    """The time limit ending the checkpoint; every point of a grid given the first's nodes or
    time; a line break into the script."""
    args = [a for s in sets for a in ("--set", s)] + [a for g in grid for a in ("--grid", g)]
    proc = run_cli("launch", "slurm", "tiny", "--set", f"run.out_dir={tmp_path}/runs", "--dry-run", *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--nodes", "0"], "--nodes"),
        (["--grid", "train.no_such_key=[1,2]"], "train.no_such_key"),
        (["--set", "launch.slurm.signal=B:USR1"], "launch.slurm.signal"),
        (["--set", "parallel.nnodes=3:2"], "parallel.nnodes"),
        # A newline in a value would add lines to the script: #SBATCH options, or commands.
        (["--set", "launch.slurm.partition=gpu\n#SBATCH --wrap=x"], "launch.slurm.partition"),
        (["--set", "run.name=job\necho pwned"], "run.name"),
        # `export KEY=...`: a key that is no shell name is a broken line, or a command.
        (["--set", 'launch.slurm.env={"1X;touch /tmp/pwn;Y": v}'], "not a shell variable name"),
        (["--time", "forever"], "launch.slurm.time"),
        (["--set", "observe.profile.tool=vtune"], "observe.profile.tool"),
        (["--profile", "ncu", "--set", "observe.profile.ncu.launch_count=-1"], "ncu.launch_count"),
        (["--profile", "nsys", "--set", "observe.profile.memory=true"], "observe.profile"),
        (["--profile", "nsys", "--set", "observe.profile.nsys.executable=nsys\nrm -rf /"], "executable"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_submits_nothing(
    tmp_path: Path, args: list[str], named: str
) -> None:
    proc = run_cli("launch", "slurm", "tiny", "--set", f"run.out_dir={tmp_path}/runs", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_secret_in_the_scripts_environment_is_refused_when_rendered(tmp_path: Path) -> None:
    """launch.slurm.env values are written in plain text into the sbatch script and config.yaml.
    Refused when the script is rendered, not when a config loads: a requeued job's workers load
    the run's stored config.yaml (exit 2 when the load refused it), and so do track, eval, report."""
    job = load_config("tiny", [f"run.out_dir={tmp_path}", "launch.slurm.env={WANDB_API_KEY: abc123}"])
    with pytest.raises(ConfigError, match=r"launch.slurm.env: WANDB_API_KEY looks like a secret.*export it"):
        render_sbatch(SlurmSubmission([job], script_dir=job.run_dir))
    stored = tmp_path / "config.yaml"
    stored.write_text(job.to_yaml())
    assert load_config(str(stored)).launch.slurm.env == {"WANDB_API_KEY": "abc123"}
    # Paths to a secret and switches are no secret (HF_HUB_DISABLE_IMPLICIT_TOKEN is a boolean).
    plain = "{HF_HUB_DISABLE_IMPLICIT_TOKEN: '1', HF_TOKEN_PATH: /p, AWS_WEB_IDENTITY_TOKEN_FILE: /f}"
    job = load_config("tiny", [f"run.out_dir={tmp_path}", f"launch.slurm.env={plain}"])
    script = render_sbatch(SlurmSubmission([job], script_dir=job.run_dir))
    assert "export HF_HUB_DISABLE_IMPLICIT_TOKEN=1" in script


def test_no_sbatch_on_the_path_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path / "empty-bin")}
    proc = run_cli("launch", "slurm", "tiny", "--set", f"run.out_dir={tmp_path}/runs", cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "sbatch is not on the PATH" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path: Path) -> None:
    out = f"run.out_dir={tmp_path}/runs"
    proc = run_cli("launch", "slurm", "tiny", "--set", out, "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n") and "hpcpipe launch agent" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_in_apptainer_hpcpipe_runs_in_the_image_and_the_scheduler_outside() -> None:
    text = _render("apptainer-staged")
    binds = "/scratch,/lustre/datasets,/local/nvme"
    inside = f"apptainer exec --nv --bind {binds} /shared/images/hpcpipe.sif hpcpipe"
    assert f"{inside} launch agent" in text and f"{inside} data stage --job" in text
    assert f"{inside} ckpt newest" in text
    # sbatch options, srun and scontrol are the host's.
    assert "\nsrun " in text and "scontrol show hostnames" in text
    assert "apptainer exec --nv scontrol" not in text
    assert "data stage" not in _render("two-nodes-8-gpus")  # no data.cache_dir: no staging step


def test_a_staged_job_whose_data_have_no_manifest_goes_on_to_train(tmp_path: Path) -> None:
    """lora-fc generates its data: the staging step the script runs with data.cache_dir set says
    there is nothing to stage and exits 0 (without --if-configured it ended the job with exit 2)."""
    cache = f"data.cache_dir={tmp_path}/cache"
    job = load_config("lora-fc-tiny", [f"run.out_dir={tmp_path}/runs", cache])
    text = render_sbatch(SlurmSubmission([job], script_dir=job.run_dir))
    line = next(ln for ln in text.splitlines() if " data stage --job " in ln)
    flags = line.split('"$config"')[1].split("||")[0].split()
    assert flags == ["--if-configured"]
    proc = run_cli("data", "stage", "--job", "lora-fc-tiny", "--set", cache, *flags, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to stage" in proc.stdout and not (tmp_path / "cache").exists()


def test_a_resubmitted_job_leaves_the_runs_config_until_it_resumed(tmp_path: Path) -> None:
    """The agents of a changed job read it beside the script; the run's config.yaml stays what
    its checkpoints belong to (rank 0 rewrites it once they loaded), so a job they refuse
    changes nothing there. The same job again uses the run's own file."""
    from hpcpipe.launch.slurm import write_submission

    job = load_config("tiny", [f"run.out_dir={tmp_path}"])
    first = write_submission(SlurmSubmission([job], script_dir=job.run_dir)).read_text()
    run_config = job.run_dir / "config.yaml"
    assert f"  {run_config}\n" in first and f"  {job.run_dir}\n" in first
    changed = load_config("tiny", [f"run.out_dir={tmp_path}", "model.d_model=64"])
    script = write_submission(SlurmSubmission([changed], script_dir=changed.run_dir)).read_text()
    submitted = changed.run_dir / "tiny.submitted.yaml"
    assert f"  {submitted}\n" in script and f"  {changed.run_dir}\n" in script
    assert run_config.read_text() == job.to_yaml() and submitted.read_text() == changed.to_yaml()
    again = write_submission(SlurmSubmission([job], script_dir=job.run_dir)).read_text()
    assert f"  {run_config}\n" in again


def test_a_submission_its_own_checks_refuse_writes_no_run_config(tmp_path: Path) -> None:
    """render_sbatch's checks run before anything is written: a refused submission left the
    run's config.yaml behind, which `launch preempted`/`finished` then read."""
    from hpcpipe.errors import UserError
    from hpcpipe.launch.slurm import write_submission

    job = load_config("tiny", [f"run.out_dir={tmp_path}", "launch.slurm.signal_grace_s=60"])
    with pytest.raises(UserError, match=r"launch\.slurm\.signal_grace_s"):
        write_submission(SlurmSubmission([job], script_dir=job.run_dir))
    assert not (job.run_dir / "config.yaml").exists()


def test_a_submission_record_that_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    from hpcpipe.errors import UserError
    from hpcpipe.launch.slurm_jobs import SUBMISSION_FILE, resolve_job

    (tmp_path / SUBMISSION_FILE).write_text("[1]\n")
    with pytest.raises(UserError, match="unreadable"):
        resolve_job(str(tmp_path))


SRUN_STUB = """#!/bin/bash
case "$*" in
  *"launch agent"*)  # the node kept training after the other was lost, then was preempted
    echo 4 > "$STATE/newest"
    [ -n "${PREEMPTED:-}" ] && echo "$PREEMPTED" >> "$RUN_DIR/events.jsonl"
    exit 137 ;;  # srun's highest task code: the lost node's
esac
"""
HPCPIPE_STUB = """#!/bin/bash
case "$1 $2" in
  "ckpt newest") cat "$STATE/newest" ;;
  "launch finished"|"launch preempted") exec "$REAL_HPCPIPE" "$@" ;;
  *) echo "unexpected: $*" >&2; exit 99 ;;
esac
"""
SCONTROL_STUB = """#!/bin/bash
if [ "$1" = show ]; then echo n1; else echo "$*" >> "$STATE/scontrol"; fi
"""


@pytest.mark.parametrize(("preempted", "exit_code"), [(True, 75), (False, 137)])
def test_an_elastic_job_preempted_after_losing_a_node_is_requeued(
    tmp_path: Path, preempted: bool, exit_code: int
) -> None:
    """srun reported the lost node's 137 over the survivors' 75: the job ended FAILED, not requeued."""
    import json

    job = load_config("tiny", [f"run.out_dir={tmp_path}/runs", "run.name=e", "parallel.nnodes=1:2"])
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(SlurmSubmission([job], script_dir=tmp_path)))
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "config.yaml").write_text(job.to_yaml())
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (state / "newest").write_text("2\n")
    for name, text in (("srun", SRUN_STUB), ("hpcpipe", HPCPIPE_STUB), ("scontrol", SCONTROL_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    event = {"time": time.time() + 5, "event": "preempted", "step": 4, "checkpointed": True, "exit_code": 75}
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STATE": str(state),
        "RUN_DIR": str(job.run_dir),
        "REAL_HPCPIPE": str(Path(sys.executable).parent / "hpcpipe"),
        "PREEMPTED": json.dumps(event) if preempted else "",
        "SLURM_JOB_ID": "41",
        "SLURM_JOB_NODELIST": "n[1-2]",
    }
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == exit_code, proc.stdout + proc.stderr
    requeued = (state / "scontrol").read_text() if (state / "scontrol").exists() else ""
    assert requeued == ("requeue 41\n" if preempted else ""), proc.stdout


def test_launch_preempted_counts_only_a_preemption_checkpoint_of_this_start(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from hpcpipe.cli.launch import app

    job = load_config("tiny", [f"run.out_dir={tmp_path}", "run.name=e"])
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "config.yaml").write_text(job.to_yaml())
    events = job.run_dir / "events.jsonl"

    def says(since: float, **event: object) -> int:
        events.write_text(json.dumps({"time": 1000.5, "event": "preempted", "step": 4, **event}) + "\n")
        return CliRunner().invoke(app, ["preempted", str(job.run_dir), "--since", str(since)]).exit_code

    assert says(990, checkpointed=True, exit_code=75) == 0
    assert says(1001, checkpointed=True, exit_code=75) == 1  # an earlier start's
    assert says(990, checkpointed=False, exit_code=75) == 1
    assert says(990, checkpointed=True, exit_code=130) == 1  # Ctrl-C: not the scheduler's


def test_a_step_that_cannot_be_read_is_no_progress(tmp_path: Path) -> None:
    """`ckpt newest` failing left both steps empty: `[ "" -le "" ]` erred, and the job requeued."""
    job = load_config("tiny", [f"run.out_dir={tmp_path}/runs", "run.name=r"])
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(SlurmSubmission([job], script_dir=tmp_path)))
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    stubs = {
        "srun": "#!/bin/bash\nexit 75\n",
        "hpcpipe": "#!/bin/bash\necho 'error: no' >&2; exit 2\n",
        "scontrol": SCONTROL_STUB,
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state), "SLURM_JOB_ID": "7"}
    env["SLURM_JOB_NODELIST"] = "n1"
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 75 and "the checkpoint step could not be read" in proc.stdout, proc.stdout
    assert not (state / "scontrol").exists()


def test_the_hpo_array_worker_gets_the_preemption_signal() -> None:
    """--signal=TERM without B: signals job steps, and the array task runs the worker in the batch
    shell without one: the 120 s of warning reached nobody."""
    from hpcpipe.hpo.slurm import render_array
    from hpcpipe.hpo.study import plan_study

    text = render_array(plan_study(load_config("tiny-hpo")), 2)
    assert "#SBATCH --signal=B:TERM@120\n" in text and "\nexec hpcpipe hpo worker " in text


def test_a_partition_list_is_checked_name_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcpipe.errors import UserError
    from hpcpipe.launch.slurm import check_partition

    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/bash\nprintf 'cpu\\ngpu\\ngpu2\\n'\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    check_partition("gpu,gpu2")  # Slurm takes a list: it was "unknown partition 'gpu,gpu2'"
    with pytest.raises(UserError, match="unknown partition 'gpu3'"):
        check_partition("gpu,gpu3")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nnodes", "2:1"], "--nnodes 2:1: give N or MIN:MAX"),
        (["--nnodes", "0"], "--nnodes 0: give N or MIN:MAX"),
        (["--rdzv-endpoint", "host:abc"], "--rdzv-endpoint host:abc: give HOST:PORT"),
        (["--rdzv-endpoint", "127.0.0.1:99999"], "--rdzv-endpoint 127.0.0.1:99999: give HOST:PORT"),
        (["--rdzv-endpoint", ":29400"], "--rdzv-endpoint :29400: give HOST:PORT"),
    ],
)
def test_the_agents_bad_flags_are_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    """A torch ValueError traceback (exit 1) for each."""
    proc = run_cli("launch", "agent", "tiny", *args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_launch_finished_judges_the_config_the_job_ran(tmp_path: Path) -> None:
    """A job resubmitted with more steps reads its submitted copy until it resumed: judged by the
    run's older config.yaml, the earlier 20-step run's end read as this 40-step job's (COMPLETED)."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(load_config("tiny", ["train.steps=20"]).to_yaml())
    submitted = tmp_path / "run.submitted.yaml"
    submitted.write_text(load_config("tiny", ["train.steps=40"]).to_yaml())
    (run / "events.jsonl").write_text(
        json.dumps({"event": "run_finished", "step": 20, "world_size": 1}) + "\n"
    )
    assert run_cli("launch", "finished", str(run)).returncode == 0  # the 20-step run did finish
    later = run_cli("launch", "finished", str(run), "--config", str(submitted))
    assert later.returncode == 1 and "not finished" in later.stdout
    assert 'launch finished "$run_dir" --config "$config"' in _render("elastic-cpu")


def test_a_hand_started_agent_gives_the_workers_the_jobs_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--grace defaulted to 60 s: with fault.preempt_grace_s 120 the agent SIGKILLed the workers
    during the checkpoint they believed they had 120 s for."""
    from hpcpipe.cli import launch

    seen: list[float] = []
    monkeypatch.setattr(launch, "_run_node_agent", lambda job, config, spec: seen.append(spec.grace_s) or 0)
    monkeypatch.setattr("hpcpipe.launch.job.prestart_node_fork_server", lambda job: None)
    monkeypatch.setattr("hpcpipe.launch.agent.stop_early_on_preemption", lambda code: None)
    config = tmp_path / "config.yaml"
    config.write_text(load_config("tiny", ["fault.preempt_grace_s=120"]).to_yaml())
    for grace, expected in ((None, 150.0), (45.0, 45.0)):
        with pytest.raises(typer.Exit):
            launch.agent(config, rdzv_endpoint="127.0.0.1:29400", grace=grace)
        assert seen[-1] == expected
