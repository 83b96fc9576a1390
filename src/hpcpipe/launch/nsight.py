"""Each worker under Nsight Systems or Nsight Compute (``observe.profile.tool: nsys | ncu``).

A profiler wraps one process: ``nsys profile ... python -m hpcpipe.launch.worker CONFIG``. Workers
forked from the agent's fork server have no command line of their own to wrap, so a profiled run
starts every worker as its own process (``AgentSpec.wrapper``, the same path as
``parallel.worker_start: spawn``); ``hpcpipe train``, ``hpcpipe launch agent`` and so the Slurm
and Kubernetes launchers all do this. Only the ranks the window profiles (``observe.profile.ranks``:
a list, default ``[0]``, or ``all``) start under the tool: the others would pay its overhead and
capture nothing. Each of them writes its own report, ``<run_dir>/profile/<tool>/<job>.rank<R>``
(the tool expands ``%q{RANK}`` from the worker's environment; the job is ``$SLURM_JOB_ID``, else
the run's name), and captures only the window's steps: the trainer calls cudaProfilerStart/Stop
around them (``observe/trace.py``), and the tool waits for those calls
(``--capture-range=cudaProfilerApi``, ``--profile-from-start off``).

Workers that torchrun or srun start directly (no hpcpipe agent) are not wrapped: rank 0 says so
in one warning line (``unwrapped_warning``), with how to wrap them.

After the run, ``export_stats`` writes each Nsight Systems report's NVTX and kernel summaries as
CSV next to it (``nsys stats``), which ``hpcpipe profile RUN_DIR`` reads.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from hpcpipe.config.observe import NcuConfig, NsysConfig, ProfileConfig
from hpcpipe.errors import UserError
from hpcpipe.observe.nsys_stats import KERNEL_CSV, NVTX_CSV, STATS_ARGS, report_dir

log = logging.getLogger("hpcpipe.launch.nsight")

# `sh -c ONLY_RANKS hpcpipe-profile "R1 R2 ..." N TOOL... APP...`: the tool's N words wrap APP only
# when $RANK (torch's agent sets it in each worker's environment) is one of the ranks; either way
# the shell execs, so the worker's process is the tool (or APP) itself, with nothing in between.
ONLY_RANKS = 'ranks=$1 n=$2; shift 2; case " $ranks " in *" $RANK "*) exec "$@";; esac; shift "$n"; exec "$@"'

# What Nsight sets in the environment of a process it profiles (the variables other projects test,
# GROMACS among them: its cudaProfilerRun check): the worker already runs under the tool.
TOOL_ENVIRONMENT = {
    "nsys": ("NSYS_PROFILING_SESSION_ID",),
    "ncu": ("NV_NSIGHT_INJECTION_TRANSPORT_TYPE", "NV_COMPUTE_PROFILER_PERFWORKS_DIR"),
}


def profiles_workers(profile: ProfileConfig | None) -> bool:
    """Whether each worker must start under a profiler (and so not from the fork server)."""
    return profile is not None and profile.tool != "torch"


def report_tag(run_name: str, env: Mapping[str, str] = os.environ) -> str:
    """The job part of a report's name: the Slurm job id (a requeued start gets its own), else the run."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return run_name
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    return job if restarts in ("", "0") else f"{job}.requeue{restarts}"


def worker_wrapper(profile: ProfileConfig | None, run_dir: Path, tag: str) -> tuple[str, ...]:
    """The command each worker's ``python -m ...`` is appended to; () when nothing wraps it.
    With ``ranks: all`` it is the tool's command; with a list of ranks, a shell that starts the
    tool for those ranks only (``ONLY_RANKS``). A tool missing from the PATH is a UserError
    (before anything is prepared or started)."""
    if profile is None or not profiles_workers(profile):
        return ()
    # The tool expands %q{RANK} from each worker's environment: one report per profiled rank.
    output = str(report_dir(run_dir.absolute(), profile.tool) / f"{tag}.rank%q{{RANK}}")
    if profile.tool == "nsys":
        tool = (require(profile.nsys.executable, "nsys"), *nsys_options(profile.nsys, output))
    else:
        tool = (require(profile.ncu.executable, "ncu"), *ncu_options(profile.ncu, output))
    if profile.ranks == "all":
        return tool
    ranks = " ".join(str(rank) for rank in profile.ranks)
    return ("/bin/sh", "-c", ONLY_RANKS, "hpcpipe-profile", ranks, str(len(tool)), *tool)


def unwrapped_warning(profile: ProfileConfig | None, env: Mapping[str, str] = os.environ) -> str | None:
    """What rank 0 of a worker that torchrun or srun started directly says when ``tool`` is nsys or
    ncu: nothing wraps it, so nothing is captured, unless the process already runs under the tool
    (``TOOL_ENVIRONMENT``). None when there is nothing to say."""
    if profile is None or not profiles_workers(profile):
        return None
    if any(env.get(var) for var in TOOL_ENVIRONMENT[profile.tool]):
        return None
    example = (
        "nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop"
        if profile.tool == "nsys"
        else "ncu --profile-from-start off --nvtx"
    )
    return (
        f"observe.profile.tool {profile.tool}: the workers were started by torchrun/srun (an "
        f"outside launcher), not by hpcpipe's agent, so hpcpipe does not start them under "
        f"{profile.tool} and nothing is captured; wrap them yourself (srun {example} -o "
        f"prof.%q{{SLURM_PROCID}} hpcpipe train JOB ...) or let hpcpipe start them (hpcpipe train "
        f"--nproc N, hpcpipe launch slurm)"
    )


def make_report_dir(profile: ProfileConfig | None, run_dir: Path) -> None:
    """The directory the wrapped workers write their reports to (the tools do not create it)."""
    if profile is not None and profiles_workers(profile):
        report_dir(run_dir, profile.tool).mkdir(parents=True, exist_ok=True)


def nsys_options(cfg: NsysConfig, output: str) -> list[str]:
    """``nsys profile`` options: the configured traces, captured between cudaProfilerStart and
    cudaProfilerStop only (``stop``: the run goes on after the window, unprofiled)."""
    return [
        "profile",
        f"--trace={','.join(cfg.trace)}",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        f"--sample={cfg.sample}",
        f"--cpuctxsw={cfg.sample}",
        f"--output={output}",
        "--force-overwrite=true",
        "--stats=false",  # the summaries are exported once, after the run (export_stats)
        *cfg.extra_args,
    ]


def ncu_options(cfg: NcuConfig, output: str) -> list[str]:
    """``ncu`` options: the configured set on at most ``launch_count`` kernels inside the window;
    ``--nvtx`` so each kernel carries hpcpipe's range stack (which phase launched it), and so
    that ``--nvtx-include`` in ``extra_args`` can narrow the kernels to one phase."""
    kernel = ["--kernel-name", cfg.kernel_name] if cfg.kernel_name else []
    return [
        "--set", cfg.set,
        "--launch-count", str(cfg.launch_count),
        "--launch-skip", str(cfg.launch_skip),
        "--profile-from-start", "off",
        "--nvtx",
        *kernel,
        "--export", output,
        "--force-overwrite",
        *cfg.extra_args,
    ]  # fmt: skip


def require(executable: str, tool: str) -> str:
    """The tool's path, or one line saying how to get it."""
    found = shutil.which(executable)
    if found is None:
        raise UserError(
            f"observe.profile.tool {tool}: {executable!r} is not on the PATH (install Nsight, or set "
            f"observe.profile.{tool}.executable)"
        )
    return found


def export_stats(run_dir: Path, cfg: NsysConfig) -> list[Path]:
    """``nsys stats`` on every report in ``<run_dir>/profile/nsys`` whose CSVs are missing or older
    than the report (``--force-overwrite=true``: a run under the same name replaced it); returns
    the reports exported. A failure is a warning: the report itself is still there to open."""
    done = []
    for report in sorted(report_dir(run_dir, "nsys").glob("*.nsys-rep")):
        prefix = str(report.with_suffix(""))
        if _exported(report, [Path(prefix + suffix) for suffix in (NVTX_CSV, KERNEL_CSV)]):
            continue
        argv = [cfg.executable, *STATS_ARGS, "--output", prefix, str(report)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("nsys stats on %s failed: %s", report, exc)
            continue
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            log.warning("nsys stats on %s failed (exit %d): %s", report, proc.returncode, reason)
            continue
        done.append(report)
    return done


def _exported(report: Path, csvs: list[Path]) -> bool:
    """Whether the report's CSVs are there and none is older than the report (nsys stats skips a
    report whose data a capture lacks, so one of them may be missing)."""
    try:
        made = report.stat().st_mtime_ns
        times = [csv.stat().st_mtime_ns for csv in csvs if csv.exists()]
    except OSError:
        return False
    return bool(times) and min(times) >= made
