"""Nsight Systems / Nsight Compute runs (``observe.profile.tool: nsys | ncu``): the capture window
the trainer opens through the CUDA profiler API, the command each worker starts under, the
``nsys stats`` CSV reader and what ``hpcpipe profile`` adds from it.

There is no GPU and no Nsight here. The window is tested against a fake ``torch.cuda.profiler``;
the launch end to end against a fake ``nsys`` that records how it was called, runs the worker,
and answers ``nsys stats`` with the checked-in sample export; preemption against a fake tool that
stays the worker's parent, as a real profiler does. That sample
(``tests/data/nsys/gpt-h100.rank0_*.csv``) is constructed, not captured: numbers written by hand
to resemble three steps of a GPT-124M DDP rank on an H100, in the exact CSV format of ``nsys stats
--format csv`` (the column headers of Nsight Systems' own ``nvtx_sum`` and ``cuda_gpu_kern_sum``
report scripts). It tests the parsing and the verdict's arithmetic, not what a GPU does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import process_alive, run_cli, tiny_job_sets

from hpcpipe.config import load_config
from hpcpipe.config.observe import NsysConfig, ProfileConfig
from hpcpipe.errors import UserError
from hpcpipe.launch import nsight
from hpcpipe.launch.agent import AgentSpec, _entry_point
from hpcpipe.launch.job import run_job
from hpcpipe.launch.launcher_watch import LAUNCHER_VAR, launcher_identity
from hpcpipe.launch.parent_death import command_ending_with_the_parent
from hpcpipe.observe.nsys_stats import NsysEvidence, read_nsys_stats, read_summary, report_dir
from hpcpipe.observe.trace import StepProfiler
from hpcpipe.observe.verdict import Thresholds, profile_run
from hpcpipe.train.environment import DistEnv

pytestmark = pytest.mark.timeout(240)

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "nsys"
ENDING = command_ending_with_the_parent(())[:-1]  # what starts the profiler (parent_death.py)


# -- the capture window ------------------------------------------------------------------------


@pytest.fixture
def profiler_api(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """cudaProfilerStart/Stop as the calls they would have been (no CUDA context here)."""
    import torch.cuda.profiler

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    return calls


def _run_window(cfg: ProfileConfig, device: str, first: int, last: int, tmp: Path, calls: list[str]) -> list:
    """(step, calls so far) after each of steps first..last, as Telemetry drives the profiler."""
    profiler = StepProfiler(cfg, 0, tmp, torch.device(device))
    profiler.start(first)
    seen = [(first - 1, list(calls))]
    for step in range(first, last + 1):
        profiler.step()  # after step `step`
        seen.append((step, list(calls)))
    profiler.close()
    return seen


def test_nsys_window_starts_before_its_first_step_and_stops_after_its_last(
    tmp_path: Path, profiler_api: list[str]
) -> None:
    cfg = ProfileConfig(tool="nsys", start_step=3, active=2, warmup=1)
    seen = dict(_run_window(cfg, "cuda", 1, 8, tmp_path, profiler_api))
    assert seen[1] == []  # steps 1 and 2 run uncaptured (nsys discards nothing: no warm-up)
    assert seen[2] == ["sync", "start"]  # armed after step 2, before step 3
    assert seen[4] == ["sync", "start", "sync", "stop"]  # steps 3 and 4 captured
    assert seen[8] == seen[4]  # the rest of the run is not
    assert not (tmp_path / "profile").exists()  # the tool writes the report, not the trainer


def test_window_edges(tmp_path: Path, profiler_api: list[str]) -> None:
    at_start = ProfileConfig(tool="ncu", start_step=1, active=1)
    seen = _run_window(at_start, "cuda", 1, 3, tmp_path, profiler_api)
    assert seen[0][1] == ["sync", "start"] and seen[1][1] == ["sync", "start", "sync", "stop"]
    profiler_api.clear()
    # A run that ends inside the window stops the capture when it closes.
    _run_window(ProfileConfig(tool="nsys", start_step=2, active=10), "cuda", 1, 4, tmp_path, profiler_api)
    assert profiler_api == ["sync", "start", "sync", "stop"]
    profiler_api.clear()
    # Resumed after the window's start, on a rank not profiled, or on CPU: no calls at all.
    _run_window(ProfileConfig(tool="nsys", start_step=2), "cuda", 5, 20, tmp_path, profiler_api)
    _run_window(ProfileConfig(tool="nsys", ranks=[1]), "cuda", 1, 20, tmp_path, profiler_api)
    _run_window(ProfileConfig(tool="nsys", start_step=2), "cpu", 1, 20, tmp_path, profiler_api)
    assert profiler_api == []


# -- the command each worker starts under ------------------------------------------------------


def _fake_tool(directory: Path, name: str, script: str = "exit 0") -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def _tool_words(wrapper: tuple[str, ...]) -> tuple[str, ...]:
    """The tool's own command inside a wrapper that starts it for some ranks only."""
    if wrapper[0] != "/bin/sh":
        return wrapper
    assert wrapper[1:4] == ("-c", nsight.ONLY_RANKS, "hpcpipe-profile")
    return wrapper[6 : 6 + int(wrapper[5])]


def test_nsys_wraps_each_worker_for_the_profiler_api_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LAUNCHER_VAR, raising=False)  # _entry_point sets it here: undone after the test
    exe = _fake_tool(tmp_path, "nsys")
    profile = ProfileConfig(
        tool="nsys", ranks="all", nsys={"executable": str(exe), "extra_args": ["--cuda-memory-usage=true"]}
    )
    run = tmp_path / "run"
    wrapper = nsight.worker_wrapper(profile, run, "4242")
    assert wrapper[:2] == (str(exe), "profile")  # ranks all: every worker under the tool itself
    assert "--trace=cuda,nvtx,osrt" in wrapper and "--capture-range=cudaProfilerApi" in wrapper
    assert "--capture-range-end=stop" in wrapper  # not the default stop-shutdown: training goes on
    assert f"--output={run.absolute()}/profile/nsys/4242.rank%q{{RANK}}" in wrapper
    assert wrapper[-1] == "--cuda-memory-usage=true"
    assert not run.exists()  # nothing written before the inputs are prepared
    nsight.make_report_dir(profile, run)
    assert report_dir(run, "nsys").is_dir()
    module_args = _entry_point(
        AgentSpec(nproc_per_node=2, wrapper=wrapper), "hpcpipe.launch.worker", ["c.yaml"]
    )
    # The tool, started to end with this process (its starter), runs the worker, which watches
    # this process through the environment (launcher_watch.py).
    worker = (sys.executable, "-u", "-m", "hpcpipe.launch.worker", "c.yaml")
    assert module_args == (sys.executable, (*ENDING[1:], str(os.getpid()), *wrapper, *worker))
    assert os.environ[LAUNCHER_VAR] == launcher_identity()
    ranks = nsight.worker_wrapper(profile.model_copy(update={"ranks": [0, 3]}), run, "4242")
    assert ranks[4:6] == ("0 3", str(len(wrapper))) and _tool_words(ranks) == wrapper


def test_only_the_ranks_the_window_profiles_start_under_the_tool(tmp_path: Path) -> None:
    """The default ranks [0]: rank 0 pays the tool's overhead and writes the one report; the
    other ranks start as plain workers (ranks: all wraps every one)."""
    exe = _fake_tool(tmp_path, "nsys", 'echo "tool $*"')
    for ranks, wrapped in (([0], {0}), ([1, 2], {1, 2}), ("all", {0, 1, 2})):
        profile = ProfileConfig(tool="nsys", ranks=ranks, nsys={"executable": str(exe)})
        wrapper = nsight.worker_wrapper(profile, tmp_path / "run", "t")
        for rank in range(3):
            proc = subprocess.run(
                [*wrapper, "echo", "app"],
                env={**os.environ, "RANK": str(rank)},
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            if rank in wrapped:  # the tool, with its options, then the worker's command line
                assert proc.stdout.startswith("tool profile --trace=") and proc.stdout.endswith(" echo app\n")
            else:
                assert proc.stdout == "app\n", (ranks, rank)


def test_ncu_profiles_a_bounded_number_of_kernels_from_the_window(tmp_path: Path) -> None:
    exe = _fake_tool(tmp_path, "ncu")
    profile = ProfileConfig(tool="ncu", ncu={"executable": str(exe), "launch_count": 5, "set": "roofline"})
    words = list(_tool_words(nsight.worker_wrapper(profile, tmp_path / "run", "tiny")))
    assert words[0] == str(exe)
    pairs = dict(zip(words[1::2], words[2::2], strict=False))
    assert pairs["--set"] == "roofline" and pairs["--launch-count"] == "5"
    assert pairs["--profile-from-start"] == "off" and "--nvtx" in words
    assert words[words.index("--kernel-name") + 1] == "regex:^(?!nccl)"
    assert words[words.index("--export") + 1].endswith("/profile/ncu/tiny.rank%q{RANK}")
    assert nsight.worker_wrapper(ProfileConfig(), tmp_path, "x") == ()  # tool torch: nothing wraps
    assert nsight.worker_wrapper(None, tmp_path, "x") == ()


def test_reports_are_named_by_job_and_a_missing_tool_is_one_line() -> None:
    assert nsight.report_tag("tiny", {}) == "tiny"
    assert nsight.report_tag("tiny", {"SLURM_JOB_ID": "77"}) == "77"
    assert nsight.report_tag("tiny", {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}) == "77.requeue2"
    missing = ProfileConfig(tool="nsys", nsys={"executable": "/nonexistent/nsys"})
    with pytest.raises(UserError) as error:
        nsight.worker_wrapper(missing, Path("run"), "x")
    assert "observe.profile.tool nsys: '/nonexistent/nsys' is not on the PATH" in str(error.value)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("observe.profile.tool=vtune", "observe.profile.tool"),
        ("observe.profile.ncu.launch_count=0", "observe.profile.ncu.launch_count"),
        ("observe.profile.ncu.launch_skip=-1", "observe.profile.ncu.launch_skip"),
        ("observe.profile.nsys.sample=everything", "observe.profile.nsys.sample"),
        ("observe.profile.nsys.trace=[]", "observe.profile.nsys.trace"),
    ],
)
def test_bad_profile_config_names_the_key(override: str, named: str) -> None:
    with pytest.raises(UserError, match=named.replace(".", r"\.")):
        load_config("tiny", [override])


def test_workers_torchrun_started_are_told_once_that_nothing_wraps_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under torchrun/srun the workers are started by them, not by hpcpipe's agent: rank 0 says in
    one line that tool nsys/ncu captures nothing unless they are wrapped, and how."""
    import hpcpipe.launch.job
    import hpcpipe.launch.worker

    monkeypatch.setattr(hpcpipe.launch.worker, "train_worker", lambda job, env, **_: None)
    for var in ("NSYS_PROFILING_SESSION_ID", *nsight.TOOL_ENVIRONMENT["ncu"]):
        monkeypatch.delenv(var, raising=False)
    job = load_config("tiny", ["observe.profile.tool=nsys"])

    def warnings_of_ranks(config: object, ranks: tuple[int, ...]) -> list[str]:
        caplog.clear()
        for rank in ranks:
            env = DistEnv(kind="torchrun", rank=rank, local_rank=rank, world_size=2, local_world_size=2)
            monkeypatch.setattr(hpcpipe.launch.job, "detect_environment", lambda env=env: env)
            with caplog.at_level(logging.WARNING, logger="hpcpipe.launch.job"):
                run_job(config)  # type: ignore[arg-type]
        return [r.getMessage() for r in caplog.records if r.name == "hpcpipe.launch.job"]

    (line,) = warnings_of_ranks(job, (0, 1))
    assert line.startswith("observe.profile.tool nsys: the workers were started by torchrun/srun")
    assert "srun nsys profile --capture-range=cudaProfilerApi" in line and "\n" not in line
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "7")  # already under nsys: nothing to say
    assert warnings_of_ranks(job, (0,)) == []
    assert warnings_of_ranks(load_config("tiny", ["observe.profile.start_step=2"]), (0,)) == []  # torch
    env = {"NV_NSIGHT_INJECTION_TRANSPORT_TYPE": "2"}
    assert nsight.unwrapped_warning(ProfileConfig(tool="ncu"), env) is None
    assert "srun ncu --profile-from-start off" in str(nsight.unwrapped_warning(ProfileConfig(tool="ncu"), {}))


# -- the nsys stats exports and the verdict ----------------------------------------------------


def _run_dir_with_sample(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    times = {"step_time_s": 0.41, "data_time_s": 0.004, "forward_time_s": 0.09, "backward_time_s": 0.27,
             "optimizer_time_s": 0.03, "comm_time_s": 0.001}  # fmt: skip
    rows = [{"step": s, "loss": 3.0, **times} for s in (10, 20, 30)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copytree(SAMPLE, report_dir(run, "nsys"))
    return run


def test_the_sample_export_reads_as_nvtx_phases_and_kernels(tmp_path: Path) -> None:
    ranges = read_summary(SAMPLE / "gpt-h100.rank0_nvtx_sum.csv", "Range")
    assert ranges[0].name == "hpcpipe:step" and ranges[0].instances == 3
    assert ranges[0].total_s == pytest.approx(1.237812466)
    ev = read_nsys_stats(_run_dir_with_sample(tmp_path))
    assert ev is not None and ev.report == "gpt-h100.rank0" and ev.steps == 3
    assert ev.step_time_s == pytest.approx(0.4126, abs=1e-4)
    assert ev.phase_s["data"] == pytest.approx(0.012297045 / 3)
    assert set(ev.phase_s) == {"data", "forward", "comm", "backward", "optimizer"}
    assert ev.regions == {"all_reduce_metrics": (pytest.approx(0.00031124), 1)}  # NCCL's own ranges left out
    assert ev.nccl_s == pytest.approx(0.20911487) and ev.kernel_s == pytest.approx(1.132137953)
    assert ev.top_kernels[1][0].startswith("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert ev.gpu_busy == pytest.approx(1.132137953 / 1.237812466)


def test_profile_reads_the_capture_of_the_runs_last_start(tmp_path: Path) -> None:
    """A Slurm requeue's capture (123.requeue1.rank0) beside the first start's (123.rank0): the
    verdict read the older one, which sorted first, though every export was written anew."""
    run = _run_dir_with_sample(tmp_path)
    nsys = report_dir(run, "nsys")
    for job, steps, at in (("123", 3, 1000.0), ("123.requeue1", 5, 3000.0)):
        for csv in nsys.glob("gpt-h100.rank0_*.csv"):
            text = csv.read_text().replace("50.2,1237812466,3,", f"50.2,1237812466,{steps},")
            (nsys / csv.name.replace("gpt-h100", job)).write_text(text)  # exported now, both
        (nsys / f"{job}.rank0.nsys-rep").touch()
        os.utime(nsys / f"{job}.rank0.nsys-rep", (at, at))
    for csv in nsys.glob("gpt-h100.*"):
        csv.unlink()
    (run / "events.jsonl").write_text(json.dumps({"event": "group_start", "time": 2000.0}) + "\n")
    rows = [json.loads(line) | {"time": 2500.0} for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    verdict, _ = profile_run(run, Thresholds())
    assert verdict.evidence.nsys is not None
    assert (verdict.evidence.nsys.report, verdict.evidence.nsys.steps) == ("123.requeue1.rank0", 5)
    assert read_nsys_stats(run, since=3500.0) is None  # no capture of that start


def test_profile_adds_the_nsys_capture_to_its_verdict(tmp_path: Path) -> None:
    run = _run_dir_with_sample(tmp_path)
    proc = run_cli("profile", str(run), "--json", str(tmp_path / "v.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "nsys gpt-h100.rank0: 3 captured step(s) of 412.6 ms" in out
    # Host-side ranges: their backward holds DDP's exposed gradient sync, the phase table's does not.
    assert "NVTX phases (host-side NVTX ranges; backward includes exposed gradient sync) data 1.0%" in out
    assert "data 1.0%, forward 23.3%, comm 0.1%, backward 67.6%, optimizer 7.0%" in out
    assert "data wait 4.1 ms per step" in out
    assert "GPU kernels 1132.1 ms over the capture: NCCL 18%, compute 82%" in out
    assert "top kernels: sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n" in out
    assert "GPU busy 91% (nsys)" in out  # no torch trace, no NVML: the kernels' share of the steps
    assert "verdict: compute-bound" in out
    verdict = json.loads((tmp_path / "v.json").read_text())
    assert verdict["evidence"]["nsys"]["steps"] == 3 and verdict["evidence"]["gpu_busy_source"] == "nsys"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("hello\n", 'no "Time (%)" header'),
        ('"Time (%)","Total Time (ns)","Range"\n1,2,x\n', "'Instances' column"),
        (
            '"Time (%)","Total Time (ns)","Instances","Style","Range"\n5.0,lots,3,PushPop,hpcpipe:step\n',
            "line 2",
        ),
    ],
)
def test_a_malformed_export_is_one_line_naming_the_file(tmp_path: Path, content: str, says: str) -> None:
    run = _run_dir_with_sample(tmp_path)
    bad = report_dir(run, "nsys") / "gpt-h100.rank0_nvtx_sum.csv"
    bad.write_text(content)
    proc = run_cli("profile", str(run), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and says in lines[0] and "Traceback" not in proc.stderr


def test_a_capture_whose_steps_add_up_to_no_time_is_described_without_shares(tmp_path: Path) -> None:
    zero = NsysEvidence(report="r.rank0", steps=3, step_time_s=0.0, phase_s={"data": 0.0})
    assert zero.describe() == [
        "nsys r.rank0: 3 captured step(s) with a total time of 0 in the export; no NVTX phase shares"
    ]
    run = _run_dir_with_sample(tmp_path)
    nvtx = report_dir(run, "nsys") / "gpt-h100.rank0_nvtx_sum.csv"
    nvtx.write_text(nvtx.read_text().replace("50.2,1237812466,3,", "0.0,0,3,"))
    proc = run_cli("profile", str(run), cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "3 captured step(s) with a total time of 0" in proc.stdout


def test_stats_are_exported_again_when_the_report_is_newer_than_its_csvs(tmp_path: Path) -> None:
    """nsys --force-overwrite=true replaces a report run again under the same name: its old CSVs
    are stale. A report with CSVs at least as new is left alone."""
    exe = _fake_tool(
        tmp_path,
        "nsys",
        'while [ $# -gt 1 ]; do [ "$1" = --output ] && prefix=$2; shift; done\n'
        'touch "${prefix}_nvtx_sum.csv" "${prefix}_cuda_gpu_kern_sum.csv"\n'
        f'echo "$prefix" >> "{tmp_path}/calls"',
    )
    run = tmp_path / "run"
    reports = report_dir(run, "nsys")
    reports.mkdir(parents=True)
    first, second = reports / "j.rank0.nsys-rep", reports / "j.rank1.nsys-rep"
    for report in (first, second):
        report.write_text("report")
    cfg = NsysConfig(executable=str(exe))
    assert nsight.export_stats(run, cfg) == [first, second]
    then = time.time() - 1000
    for path in reports.iterdir():
        os.utime(path, (then, then) if path.suffix == ".csv" else (then - 10, then - 10))
    assert nsight.export_stats(run, cfg) == []  # up to date
    os.utime(first, (then + 10, then + 10))  # the run was profiled again under the same name
    assert nsight.export_stats(run, cfg) == [first]
    (reports / "j.rank1_nvtx_sum.csv").unlink()
    (reports / "j.rank1_cuda_gpu_kern_sum.csv").unlink()
    assert nsight.export_stats(run, cfg) == [second]  # no CSVs at all
    assert len((tmp_path / "calls").read_text().splitlines()) == 4


# -- end to end: hpcpipe train under (a fake) nsys -----------------------------------------------

FAKE_NSYS = """#!{python}
# Stands in for Nsight Systems: `profile OPTIONS... APP...` runs APP and, when it ends (as nsys
# writes its report), records its call; `stats ... --output PREFIX REPORT` writes the sample
# exports as PREFIX_<report>.csv.
import json, os, shutil, subprocess, sys
args = sys.argv[1:]
if args[0] == "profile":
    options = [a for a in args[1:] if a.startswith("--")]
    app = args[1 + len(options):]
    output = dict(o[2:].split("=", 1) for o in options)["output"].replace("%q{{RANK}}", os.environ["RANK"])
    code = subprocess.call(app)
    with open(output + ".nsys-rep", "w") as fh:
        json.dump({{"options": options, "app": app}}, fh)
    sys.exit(code)
prefix = args[args.index("--output") + 1]
with open(prefix + ".stats-args", "w") as fh:
    json.dump(args, fh)
for report in ("nvtx_sum", "cuda_gpu_kern_sum"):
    shutil.copy(os.path.join({sample!r}, "gpt-h100.rank0_" + report + ".csv"), prefix + "_" + report + ".csv")
"""


def test_train_starts_the_worker_under_nsys_and_exports_its_summaries(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(FAKE_NSYS.format(python=sys.executable, sample=str(SAMPLE)))
    fake.chmod(0o755)
    sets = tiny_job_sets(
        tmp_path, "nsys-run", "train.steps=3", "observe.profile.tool=nsys", "observe.profile.start_step=2",
        f"observe.profile.nsys.executable={fake}",
    )  # fmt: skip
    proc = run_cli("train", "tiny", *sets, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = report_dir(tmp_path / "nsys-run", "nsys")
    call = json.loads((reports / "nsys-run.rank0.nsys-rep").read_text())  # one rank, named by run
    assert "--capture-range=cudaProfilerApi" in call["options"]
    assert call["app"][1:] == [
        "-u",
        "-m",
        "hpcpipe.launch.worker",
        str(tmp_path / "nsys-run" / "config.yaml"),
    ]
    stats = json.loads((reports / "nsys-run.rank0.stats-args").read_text())
    assert stats[:6] == [
        "stats",
        "--report",
        "nvtx_sum,cuda_gpu_kern_sum",
        "--format",
        "csv",
        "--force-export=true",
    ]
    assert stats[-1] == str(reports / "nsys-run.rank0.nsys-rep")
    verdict = run_cli("profile", str(tmp_path / "nsys-run"), cwd=tmp_path)
    assert verdict.returncode == 0 and "nsys nsys-run.rank0: 3 captured step(s)" in verdict.stdout


# -- preemption reaches a worker the tool keeps as its child ------------------------------------

# A profiler that stays the worker's parent (nsys and ncu do; the fake nsys above execs into the
# worker, which would hide where a signal goes): it forks, runs the app in the child, waits for it
# and exits with its code. `survives`: it outlives SIGUSR1 (a handler that does nothing, so the
# worker keeps SIGUSR1's default); otherwise SIGUSR1 kills it and its worker is orphaned.
FORKING_TOOL = """#!{python}
import os, signal, sys
if {survives}:
    signal.signal(signal.SIGUSR1, lambda *_: None)
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""

# The worker (no torch): "checkpoint" takes half a second on SIGUSR1 and exits 75; "ignore" ignores it.
# It watches its launcher first thing, as hpcpipe's worker.main does.
FAKE_WORKER = """import os, signal, sys, time
from hpcpipe.launch.launcher_watch import watch_the_launcher
watch_the_launcher()
out, mode = sys.argv[1], sys.argv[2]
def checkpoint(*_):
    time.sleep(0.5)
    open(os.path.join(out, "checkpointed"), "w").close()
    os._exit(75)
signal.signal(signal.SIGUSR1, checkpoint if mode == "checkpoint" else signal.SIG_IGN)
open(os.path.join(out, "pid.tmp"), "w").write(str(os.getpid()))
os.replace(os.path.join(out, "pid.tmp"), os.path.join(out, "pid"))
while True:
    time.sleep(0.1)
"""

AGENT = """import sys
from hpcpipe.launch.agent import AgentSpec, run_agent
spec = AgentSpec(nproc_per_node=1, grace_s={grace}, monitor_interval_s=0.1, wrapper=({tool!r},))
sys.exit(run_agent(spec, "fake_worker", [{out!r}, {mode!r}]))
"""


GRACE_S = 3.0  # the agent's wait for a signalled worker (its worker needs 0.5 s)


def _agent_under_a_forking_tool(
    tmp_path: Path, mode: str, survives: bool
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """An agent (1 worker, a 3 s grace) whose worker runs under ``FORKING_TOOL``: the agent,
    the folder the worker writes to, and the agent's log."""
    tool = tmp_path / "tool"
    tool.write_text(FORKING_TOOL.format(python=sys.executable, survives=survives))
    tool.chmod(0o755)
    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    script = AGENT.format(grace=GRACE_S, tool=str(tool), out=str(out), mode=mode)
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    log = tmp_path / "agent.log"  # not a pipe: an orphaned worker would hold it open
    with log.open("w") as fh:
        agent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=env, stdout=fh, stderr=fh)
    return agent, out, log


def _worker_pid(agent: subprocess.Popen[bytes], out: Path, log: Path) -> int:
    """The fake worker's pid, once it has started."""
    deadline = time.monotonic() + 90
    while not (out / "pid").exists():
        assert agent.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    return int((out / "pid").read_text())


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize(
    ("mode", "survives", "code"),
    [
        ("checkpoint", True, 75),  # the worker checkpoints; the tool passes its 75 on
        # The tool dies of the signal (nothing of its own failed: a preemption, 75, as for a worker
        # that dies of it before its trainer's handler); the worker must not outlive the grace.
        ("ignore", False, 75),
    ],
)
def test_preemption_reaches_a_worker_that_the_tool_runs_as_its_child(
    tmp_path: Path, mode: str, survives: bool, code: int
) -> None:
    agent, out, log = _agent_under_a_forking_tool(tmp_path, mode, survives)
    worker = 0
    try:
        worker = _worker_pid(agent, out, log)
        assert _parent(worker) != agent.pid  # the worker is the tool's child, the agent's grandchild
        started = time.monotonic()
        agent.send_signal(signal.SIGUSR1)
        agent.wait(timeout=60)
        assert agent.returncode == code, log.read_text()[-3000:]
        if mode == "checkpoint":
            assert (out / "checkpointed").exists()  # before the agent returned
        else:
            assert time.monotonic() - started >= GRACE_S  # the agent waited out the grace for the worker
            deadline = time.monotonic() + 5
            while process_alive(worker) and time.monotonic() < deadline:  # its SIGKILL is on the way
                time.sleep(0.05)
            assert not process_alive(worker), "the worker outlived the agent"
    finally:
        if agent.poll() is None:
            agent.kill()
        if worker and process_alive(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_an_agent_killed_outright_takes_the_tool_and_its_worker_with_it(tmp_path: Path) -> None:
    """SIGKILL runs none of the agent's code: the tool must end because its parent did (it was
    started through ``parent_death.py``), and the worker because the agent it watches did."""
    agent, out, log = _agent_under_a_forking_tool(tmp_path, "ignore", survives=True)
    worker = tool = 0
    try:
        worker = _worker_pid(agent, out, log)
        tool = _parent(worker)
        assert tool != agent.pid and _parent(tool) == agent.pid
        agent.kill()
        agent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (process_alive(tool) or process_alive(worker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(tool), "the tool outlived the agent killed outright"
        assert not process_alive(worker), "the worker outlived the agent"
    finally:
        for pid in (worker, tool):
            if pid and process_alive(pid):
                os.kill(pid, signal.SIGKILL)
