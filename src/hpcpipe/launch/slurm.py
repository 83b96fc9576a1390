"""``hpcpipe launch slurm``: render a readable sbatch script from ``launch.slurm`` and submit it.

The launcher only renders and submits; what runs on the nodes detects the rest (the agent reads
``SLURMD_NODENAME``, the workers read torchrun's variables). One script serves a single run and a
job array (one task per sweep point, each with its own run directory).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.config import JobConfig
from hpcpipe.config.launch import SlurmConfig
from hpcpipe.errors import UserError
from hpcpipe.launch.job import check_node_range
from hpcpipe.layout import RunLayout, SweepLayout
from hpcpipe.observe.nsys_stats import STATS_ARGS

SCRIPT_NAME = RunLayout.SLURM_SCRIPT


@dataclass(frozen=True)
class SlurmSubmission:
    """What to submit: one job, or one array task per job (a sweep)."""

    jobs: list[JobConfig]
    script_dir: Path  # where job.sbatch and the Slurm output files go
    sweep_dir: Path | None = None  # an array: the sweep's CSV is gathered here

    @property
    def first(self) -> JobConfig:
        return self.jobs[0]


def render_sbatch(sub: SlurmSubmission) -> str:
    """The sbatch script (a pure function of the configs, and of whether their run directories
    hold another config.yaml already: ``submitted_config``; golden-file tested)."""
    import jinja2

    from hpcpipe import __version__

    job = sub.first
    slurm = job.launch.slurm
    min_nodes, max_nodes = job.parallel.node_range
    nproc = workers_per_node(job)
    array = len(sub.jobs) if sub.sweep_dir is not None else 0
    # A single run writes into its run directory; an array into its sweep directory.
    output = sub.script_dir.absolute() / (SweepLayout.SLURM_OUTPUT if array else RunLayout.SLURM_OUTPUT)
    env = dict(slurm.env)
    if slurm.cpus_per_task:  # every worker gets its share of the node's cores
        env.setdefault("OMP_NUM_THREADS", str(max(1, slurm.cpus_per_task // nproc)))
    template = jinja2.Environment(
        loader=jinja2.PackageLoader("hpcpipe.launch", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # a shell script: values are quoted with the `quote` filter instead
    )
    template.filters["quote"] = lambda value: shlex.quote(str(value))
    title = (
        f"{len(sub.jobs)} sweep points of {job.run.recipe}" if array else f"{job.run.recipe}: {job.run_dir}"
    )
    if (layout := job.parallel.layout_at(max_nodes * nproc)) is not None:
        pp, dp, tp = layout
        title += f"\n# layout: pipeline {pp} x data {dp} x tensor {tp} (tensor parallel inside each node)"
    return template.get_template("slurm.sbatch.j2").render(
        title=title,
        version=__version__,
        name=_job_name(sub),
        nodes=max_nodes,
        min_nodes=min_nodes,
        nnodes=job.parallel.nnodes,
        elastic=min_nodes < max_nodes,
        nproc=nproc,
        s=slurm,
        env=env,
        array_size=array,
        output=output,
        configs=[str(submitted_config(j, sub.script_dir).absolute()) for j in sub.jobs],
        run_dirs=[str(j.run_dir.absolute()) for j in sub.jobs],
        hpcpipe=hpcpipe_command(slurm),
        stage=job.data.cache_dir is not None,
        grace_s=job.fault.agent_grace_s,
        preempt_code=job.fault.preempt_exit_code,
        sweep_dir=str(sub.sweep_dir.absolute()) if sub.sweep_dir else "",
        **_profile_vars(job),
    )


def _profile_vars(job: JobConfig) -> dict[str, str]:
    """An Nsight run (observe.profile.tool): the agents wrap the workers themselves; the script
    says so and, for nsys, exports each report's summaries after the job step."""
    profile = job.observe.profile
    tool = profile.tool if profile is not None and profile.tool != "torch" else ""
    nsys = profile.nsys.executable if profile is not None else "nsys"
    slurm = job.launch.slurm
    return {
        "profile_tool": tool,
        "nsys": node_command(slurm, nsys) if slurm.container else shlex.quote(nsys),
        "nsys_stats": " ".join(STATS_ARGS),
    }


def hpcpipe_command(slurm: SlurmConfig) -> str:
    """hpcpipe as the nodes run it: bare, or inside the Apptainer image."""
    return node_command(slurm, slurm.hpcpipe)


def node_command(slurm: SlurmConfig, program: str) -> str:
    """A program the nodes run from the job's software: bare, or inside the Apptainer image."""
    if slurm.container is None:
        return program
    words = ["apptainer", "exec"]
    if slurm.gpus_per_node:
        words.append("--nv")
    if slurm.container_binds:
        words += ["--bind", ",".join(slurm.container_binds)]
    return " ".join(shlex.quote(w) for w in [*words, slurm.container, program])


def workers_per_node(job: JobConfig) -> int:
    return job.launch.slurm.gpus_per_node or job.parallel.nproc


def check_world_sizes(job: JobConfig) -> None:
    check_node_range(job, workers_per_node(job))


def submitted_config(job: JobConfig, script_dir: Path) -> Path:
    """The file the job's agents read: its run's config.yaml when there is none yet (or the same),
    else ``<script_dir>/<run.name>.submitted.yaml``: the run's config.yaml stays what its
    checkpoints belong to until the job has resumed (rank 0 writes it then), so a job they refuse
    changes nothing there."""
    run_config = RunLayout(job.run_dir).config
    if run_config.is_file() and run_config.read_text() != job.to_yaml():
        return script_dir / f"{job.run.name}.submitted.yaml"
    return run_config


def write_submission(sub: SlurmSubmission) -> Path:
    """Write each run's config (``submitted_config``) and the script; returns the script's path."""
    for job in sub.jobs:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        sub.script_dir.mkdir(parents=True, exist_ok=True)
        submitted_config(job, sub.script_dir).write_text(job.to_yaml())
    sub.script_dir.mkdir(parents=True, exist_ok=True)
    script = sub.script_dir / SCRIPT_NAME
    script.write_text(render_sbatch(sub))
    return script


def require_sbatch() -> str:
    """The sbatch executable, or one line saying what is missing."""
    found = shutil.which("sbatch")
    if found is None:
        raise UserError("sbatch is not on the PATH: run this on a Slurm login node (or use --dry-run)")
    return found


def check_partition(partition: str | None) -> None:
    """An unknown partition fails here, naming the known ones, instead of as a pending job."""
    if partition is None or shutil.which("sinfo") is None:
        return
    proc = _run(["sinfo", "--noheader", "--format=%R"])
    known = sorted(set(proc.stdout.split()))
    if proc.returncode == 0 and known and partition not in known:
        raise UserError(
            f"launch.slurm.partition: unknown partition {partition!r} (known: {', '.join(known)})"
        )


def submit(script: Path) -> str:
    """``sbatch --parsable SCRIPT`` -> the job id; sbatch's own message when it refuses."""
    proc = _run([require_sbatch(), "--parsable", str(script)])
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"sbatch refused {script}: {reason}")
    return proc.stdout.strip().split(";")[0]  # "<id>[;<cluster>]"


def _job_name(sub: SlurmSubmission) -> str:
    return sub.first.run.name if sub.sweep_dir is None else sub.sweep_dir.name


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{argv[0]}: {exc}") from None
