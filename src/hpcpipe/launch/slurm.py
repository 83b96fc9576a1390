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
from typing import TYPE_CHECKING

from hpcpipe.config import JobConfig
from hpcpipe.config.launch import SlurmConfig, check_plain_env
from hpcpipe.errors import UserError
from hpcpipe.launch.job import check_node_range
from hpcpipe.layout import RunLayout, SweepLayout
from hpcpipe.observe.nsys_stats import STATS_ARGS

if TYPE_CHECKING:
    import jinja2

SCRIPT_NAME = RunLayout.SLURM_SCRIPT
SIGNAL_MARGIN_S = 30  # after the agents' grace: the job step's end, `ckpt newest`, the requeue


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
    from hpcpipe import __version__

    job = sub.first
    slurm = job.launch.slurm
    min_nodes, max_nodes = job.parallel.node_range
    nproc = workers_per_node(job)
    array = len(sub.jobs) if sub.sweep_dir is not None else 0
    # A single run writes into its run directory; an array into its sweep directory.
    output = sub.script_dir.absolute() / (SweepLayout.SLURM_OUTPUT if array else RunLayout.SLURM_OUTPUT)
    for each in sub.jobs:  # each one's config.yaml, beside the script, holds its environment too
        check_plain_env(each.launch)
    env = dict(slurm.env)
    if slurm.cpus_per_task:  # every worker gets its share of the node's cores
        env.setdefault("OMP_NUM_THREADS", str(max(1, slurm.cpus_per_task // nproc)))
    _check_signal_lead(job)
    _same_resources(sub)
    template = sbatch_templates()
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
        # Slurm 22.05 and 23.02 do not pass sbatch's --cpus-per-task on to srun: each step asks.
        cpus=f" --cpus-per-task={slurm.cpus_per_task}" if slurm.cpus_per_task else "",
        **_profile_vars(job),
    )


def sbatch_templates() -> jinja2.Environment:
    """The sbatch templates, with their filters: ``quote`` (a shell word), ``sbatch_word`` and
    ``sbatch_path`` (an #SBATCH directive's value: sbatch splits those on whitespace, and expands
    ``%`` in file names)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hpcpipe.launch", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # a shell script: values are quoted with the filters instead
    )
    env.filters["quote"] = lambda value: shlex.quote(str(value))
    env.filters["sbatch_word"] = _sbatch_word
    env.filters["sbatch_path"] = _sbatch_path
    return env


def _sbatch_word(value: object) -> str:
    text = str(value)
    if '"' in text or "\n" in text:
        raise UserError(f"{text!r}: an #SBATCH value cannot hold a double quote or a line break")
    return text if text and not any(c.isspace() for c in text) else f'"{text}"'


def _sbatch_path(value: object) -> str:
    """An output path: ``%`` in its folders doubled (literal), its file name's patterns (``%j``,
    ``%A_%a``) kept for sbatch to expand."""
    path = Path(str(value))
    return _sbatch_word(f"{str(path.parent).replace('%', '%%')}/{path.name}")


def _check_signal_lead(job: JobConfig) -> None:
    """The signal must come early enough for the agent's grace and the requeue decision after it:
    otherwise the time limit ends the checkpoint, and the job (TIMEOUT) is never requeued."""
    lead, grace = job.launch.slurm.signal_grace_s, job.fault.agent_grace_s
    if lead < grace + SIGNAL_MARGIN_S:
        raise UserError(
            f"launch.slurm.signal_grace_s {lead}: the agents wait up to {grace} s for the checkpoint "
            f"(fault.preempt_grace_s + 30); give {grace + SIGNAL_MARGIN_S} or more"
        )


# Keys whose values a job array takes from its first point (one #SBATCH header, one srun line).
_ARRAY_WIDE = ("launch", "parallel.nnodes", "parallel.nproc", "fault", "data.cache_dir")


def _same_resources(sub: SlurmSubmission) -> None:
    """A sweep's points share the script's resources: a grid over them ran every point with the
    first point's nodes, time and ranks without a word."""
    first = sub.first.to_dict()
    for job in sub.jobs[1:]:
        other = job.to_dict()
        for key in _ARRAY_WIDE:
            if _value(first, key) != _value(other, key):
                raise UserError(
                    f"--grid over {key}: the points of one Slurm array share its nodes, time and "
                    "ranks; sweep it as separate `hpcpipe launch slurm` jobs"
                )


def _value(tree: dict[str, object], key: str) -> object:
    node: object = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


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
    """Write each run's config (``submitted_config``) and the script; returns the script's path.

    The script is rendered first: its checks (grace, one resource shape per grid, ``#SBATCH``
    values) refuse a submission before any run directory holds a config it never ran."""
    text = render_sbatch(sub)
    for job in sub.jobs:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        sub.script_dir.mkdir(parents=True, exist_ok=True)
        submitted_config(job, sub.script_dir).write_text(job.to_yaml())
    sub.script_dir.mkdir(parents=True, exist_ok=True)
    script = sub.script_dir / SCRIPT_NAME
    script.write_text(text)
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
    unknown = [p for p in partition.split(",") if p not in known]  # Slurm takes a list: gpu,gpu2
    if proc.returncode == 0 and known and unknown:
        raise UserError(
            f"launch.slurm.partition: unknown partition {unknown[0]!r} (known: {', '.join(known)})"
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
