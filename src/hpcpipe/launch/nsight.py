"""Each worker under Nsight Systems or Nsight Compute (``observe.profile.tool: nsys | ncu``).

A profiler wraps one process: ``nsys profile ... python -m hpcpipe.launch.worker CONFIG``. Workers
forked from the agent's fork server have no command line of their own to wrap, so a profiled run
starts every worker as its own process under the tool (``AgentSpec.wrapper``, the same path as
``parallel.worker_start: spawn``); ``hpcpipe train``, ``hpcpipe launch agent`` and so the Slurm
and Kubernetes launchers all do this. Each rank writes its own report,
``<run_dir>/profile/<tool>/<job>.rank<R>`` (the tool expands ``%q{RANK}`` from the worker's
environment; the job is ``$SLURM_JOB_ID``, else the run's name), and captures only the window's
steps: the trainer calls cudaProfilerStart/Stop around them (``observe/trace.py``), and the tool
waits for those calls (``--capture-range=cudaProfilerApi``, ``--profile-from-start off``).

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
from hpcpipe.observe.nsys_stats import NVTX_CSV, STATS_ARGS, report_dir

log = logging.getLogger("hpcpipe.launch.nsight")


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
    A tool missing from the PATH is a UserError (before anything is prepared or started)."""
    if profile is None or not profiles_workers(profile):
        return ()
    # The tool expands %q{RANK} from each worker's environment: one report per rank.
    output = str(report_dir(run_dir.absolute(), profile.tool) / f"{tag}.rank%q{{RANK}}")
    if profile.tool == "nsys":
        return (require(profile.nsys.executable, "nsys"), *nsys_options(profile.nsys, output))
    return (require(profile.ncu.executable, "ncu"), *ncu_options(profile.ncu, output))


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
    """``nsys stats`` on every report in ``<run_dir>/profile/nsys`` without its CSVs yet; returns
    the reports exported. A failure is a warning: the report itself is still there to open."""
    done = []
    for report in sorted(report_dir(run_dir, "nsys").glob("*.nsys-rep")):
        prefix = str(report.with_suffix(""))
        if Path(prefix + NVTX_CSV).exists():
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
